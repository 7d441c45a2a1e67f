/* SPDX-License-Identifier: MIT */
/*
 * models.c - networks as lists of per-layer gradients: the presets of
 * fr_step(1) and its --model files.
 *
 * The presets are generated from the architectures, layer by layer, so
 * that both the parameter counts (which size the All-Reduces) and the
 * multiply-adds (which size the backward compute) come from the same
 * shapes; their totals are the papers' (ResNet-50 25,557,032, BERT-base
 * 109,482,240, VGG-16 138,357,544, GPT-2 small 124,439,808).  A "layer" is
 * the group of tensors whose gradients backward produces together: a
 * convolution with its batch norm, a linear layer with its bias, a layer
 * norm.  Only convolutions and matrix products count as compute; norms,
 * activations and embedding look-ups are memory-bound and small, and get
 * no time of their own.  Layers are listed in forward order, which is also
 * their order in the flat gradient arena (as in PyTorch's parameter
 * order); backward visits them in reverse.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step.h"

/* Append a layer; out of memory is remembered in m->oom, so that the
 * builders below read as the architectures do. */
static void add(struct st_model *m, const char *name, uint64_t params,
		double macs)
{
	struct st_layer *l;

	if (m->oom)
		return;
	if (m->nlayers == m->cap) {
		int cap = m->cap ? 2 * m->cap : 64;
		struct st_layer *n =
			realloc(m->layers, sizeof(*n) * (size_t)cap);

		if (!n) {
			m->oom = 1;
			return;
		}
		m->layers = n;
		m->cap = cap;
	}
	l = &m->layers[m->nlayers++];
	memset(l, 0, sizeof(*l));
	snprintf(l->name, sizeof(l->name), "%s", name);
	l->params_full = params;
	l->macs = macs;
	m->params_full += params;
}

/* A k x k convolution cin -> cout producing hw x hw, with its batch norm
 * (scale and shift per channel) or bias. */
static void conv(struct st_model *m, const char *name, int k, int cin, int cout,
		 int hw, int bn)
{
	uint64_t w = (uint64_t)k * k * cin * cout;

	add(m, name, w + (uint64_t)(bn ? 2 : 1) * cout, (double)w * hw * hw);
}

/* A linear layer in -> out with bias, applied to tokens rows. */
static void linear(struct st_model *m, const char *name, int in, int out,
		   double tokens)
{
	add(m, name, (uint64_t)in * out + out, (double)in * out * tokens);
}

/* torchvision's resnet50 (v1.5: the stride is in the 3x3 convolution). */
static void resnet50(struct st_model *m)
{
	static const int blocks[4] = {3, 4, 6, 3},
			 planes[4] = {64, 128, 256, 512};
	int in = 64;
	char name[48];

	conv(m, "conv1", 7, 3, 64, 112, 1);
	for (int s = 0; s < 4; s++) {
		int hw = 56 >> s, p = planes[s];

		for (int b = 0; b < blocks[s]; b++) {
			int hw_in = b == 0 && s > 0 ? 2 * hw : hw;

			snprintf(name, sizeof(name), "layer%d.%d.conv1", s + 1,
				 b);
			conv(m, name, 1, in, p, hw_in, 1);
			snprintf(name, sizeof(name), "layer%d.%d.conv2", s + 1,
				 b);
			conv(m, name, 3, p, p, hw, 1);
			snprintf(name, sizeof(name), "layer%d.%d.conv3", s + 1,
				 b);
			conv(m, name, 1, p, 4 * p, hw, 1);
			if (b == 0) {
				snprintf(name, sizeof(name),
					 "layer%d.0.downsample", s + 1);
				conv(m, name, 1, in, 4 * p, hw, 1);
			}
			in = 4 * p;
		}
	}
	linear(m, "fc", 2048, 1000, 1);
}

/* torchvision's vgg16 (configuration D, no batch norm). */
static void vgg16(struct st_model *m)
{
	static const int cfg[] = {64, 64,  0,	128, 128, 0,   256, 256, 256,
				  0,  512, 512, 512, 0,	  512, 512, 512, 0};
	int in = 3, hw = 224, i = 0;
	char name[48];

	for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		if (!cfg[c]) { /* 2x2 max pooling */
			hw /= 2;
			continue;
		}
		snprintf(name, sizeof(name), "features.conv%d", ++i);
		conv(m, name, 3, in, cfg[c], hw, 0);
		in = cfg[c];
	}
	linear(m, "classifier.fc6", 512 * 7 * 7, 4096, 1);
	linear(m, "classifier.fc7", 4096, 4096, 1);
	linear(m, "classifier.fc8", 4096, 1000, 1);
}

/*
 * One Transformer block of width d on t tokens: q, k, v and the attention
 * itself (t x t scores and the weighted sum, 2 t^2 d multiply-adds, counted
 * with the qkv projection whose gradient they precede in backward), the
 * output projection, the 4d MLP and two layer norms, in the order of
 * BERT (post-norm) or GPT-2 (pre-norm).
 */
static void block(struct st_model *m, const char *pfx, int d, double t, int pre)
{
	char name[48];

	if (pre) {
		snprintf(name, sizeof(name), "%s.ln_1", pfx);
		add(m, name, 2 * (uint64_t)d, 0);
	}
	snprintf(name, sizeof(name), "%s.attn.qkv", pfx);
	add(m, name, 3 * ((uint64_t)d * d + d),
	    3.0 * d * d * t + 2.0 * t * t * d);
	snprintf(name, sizeof(name), "%s.attn.out", pfx);
	linear(m, name, d, d, t);
	snprintf(name, sizeof(name), "%s.ln_%s", pfx, pre ? "2" : "attn");
	add(m, name, 2 * (uint64_t)d, 0);
	snprintf(name, sizeof(name), "%s.mlp.fc", pfx);
	linear(m, name, d, 4 * d, t);
	snprintf(name, sizeof(name), "%s.mlp.proj", pfx);
	linear(m, name, 4 * d, d, t);
	if (!pre) {
		snprintf(name, sizeof(name), "%s.ln_out", pfx);
		add(m, name, 2 * (uint64_t)d, 0);
	}
}

/* BERT-base uncased with its pooler, sequences of 128 tokens. */
static void bert_base(struct st_model *m)
{
	char pfx[32];

	add(m, "embeddings.word", 30522 * 768ull, 0);
	add(m, "embeddings.pos+type+ln", 512 * 768ull + 2 * 768ull + 2 * 768ull,
	    0);
	for (int i = 0; i < 12; i++) {
		snprintf(pfx, sizeof(pfx), "encoder.%d", i);
		block(m, pfx, 768, 128, 0);
	}
	linear(m, "pooler", 768, 768, 1);
}

/* GPT-2 small (HF "gpt2"), sequences of 1024 tokens.  The output layer is
 * tied to the token embedding: its product (the largest of the model) is
 * the first thing backward computes, but its gradient adds to wte's, which
 * is complete only at the very end of backward. */
static void gpt2_small(struct st_model *m)
{
	char pfx[32];

	add(m, "wte", 50257 * 768ull, 0);
	add(m, "wpe", 1024 * 768ull, 0);
	for (int i = 0; i < 12; i++) {
		snprintf(pfx, sizeof(pfx), "h.%d", i);
		block(m, pfx, 768, 1024, 1);
	}
	add(m, "ln_f", 2 * 768ull, 0);
	add(m, "lm_head(tied:wte)", 0, 768.0 * 50257 * 1024);
}

static const struct preset {
	const char *name, *what;
	uint64_t paper;
	int batch;
	void (*build)(struct st_model *m);
} presets[] = {
	{"resnet50", "ResNet-50 (He et al. 2016), 224x224 images", 25600000, 32,
	 resnet50},
	{"bert-base", "BERT-base (Devlin et al. 2019), 128-token sequences",
	 110000000, 32, bert_base},
	{"vgg16", "VGG-16 (Simonyan & Zisserman 2015), 224x224 images",
	 138000000, 32, vgg16},
	{"gpt2-small",
	 "GPT-2 small (Radford et al. 2019), 1024-token sequences", 124000000,
	 8, gpt2_small},
};

const char *st_preset_name(int i)
{
	return i >= 0 && i < (int)(sizeof(presets) / sizeof(presets[0]))
		       ? presets[i].name
		       : NULL;
}

int st_model_preset(const char *name, struct st_model *m)
{
	memset(m, 0, sizeof(*m));
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
		const struct preset *p = &presets[i];

		if (strcmp(name, p->name))
			continue;
		snprintf(m->name, sizeof(m->name), "%s", p->name);
		m->what = p->what;
		m->paper = p->paper;
		m->batch = p->batch;
		p->build(m);
		if (m->oom) {
			st_model_free(m);
			return -1;
		}
		st_model_scale(m, 1);
		return 0;
	}
	return -1;
}

int st_model_load(const char *path, struct st_model *m, char *err,
		  size_t errlen)
{
	FILE *f = fopen(path, "r");
	char line[512];
	int lineno = 0;
	const char *base = strrchr(path, '/');

	memset(m, 0, sizeof(*m));
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	snprintf(m->name, sizeof(m->name), "%s", base ? base + 1 : path);
	m->what = "layers from a --model file";
	m->batch = 1;
	while (fgets(line, sizeof(line), f)) {
		char name[48], *hash = strchr(line, '#');
		double params, ms;
		int end = -1;

		lineno++;
		if (hash)
			*hash = '\0';
		if (strspn(line, " \t\r\n") == strlen(line))
			continue;
		/* params may be written 25.6e6, but must be a whole count */
		if (sscanf(line, " %47s %lf %lf %n", name, &params, &ms,
			   &end) != 3 ||
		    end < 0 || line[end] || !(params >= 0) || params > 1e12 ||
		    params != floor(params) || !(ms >= 0) || ms > 1e7)
			goto bad;
		add(m, name, (uint64_t)params, 0);
		if (m->oom)
			goto bad;
		m->layers[m->nlayers - 1].ms = ms;
	}
	fclose(f);
	if (!m->nlayers || !m->params_full) {
		snprintf(err, errlen, "%s: no layers with parameters", path);
		st_model_free(m);
		return -1;
	}
	st_model_scale(m, 1);
	return 0;
bad:
	fclose(f);
	snprintf(
		err, errlen,
		"%s:%d: expected \"name params compute_ms\" (params a whole number >= 0, ms >= 0)",
		path, lineno);
	st_model_free(m);
	return -1;
}

void st_model_scale(struct st_model *m, double scale)
{
	size_t off = 0;

	m->compute_ms = 0;
	for (int i = 0; i < m->nlayers; i++) {
		struct st_layer *l = &m->layers[i];
		double p = (double)l->params_full * scale;

		/* a layer keeps a gradient of its own, however small, so the
		 * bucket ready times keep the model's shape */
		l->params = l->params_full ? (size_t)fmax(llround(p), 1) : 0;
		l->off = off;
		off += l->params;
		m->compute_ms += l->ms;
	}
	m->params = off;
}

double st_model_flops(const struct st_model *m)
{
	double macs = 0;

	for (int i = 0; i < m->nlayers; i++)
		macs += m->layers[i].macs;
	return 4 * macs;
}

void st_model_time_flops(struct st_model *m, int batch, double gflops)
{
	m->compute_ms = 0;
	m->batch = batch;
	for (int i = 0; i < m->nlayers; i++) {
		struct st_layer *l = &m->layers[i];

		l->ms = 4 * l->macs * batch / (gflops * 1e9) * 1e3;
		m->compute_ms += l->ms;
	}
}

void st_model_time_total(struct st_model *m, double ms)
{
	double macs = st_model_flops(m), sum = m->compute_ms;

	for (int i = 0; i < m->nlayers; i++) {
		struct st_layer *l = &m->layers[i];
		double w = macs > 0  ? 4 * l->macs / macs
			   : sum > 0 ? l->ms / sum
				     : (double)l->params_full /
					       (double)m->params_full;

		l->ms = ms * w;
	}
	m->compute_ms = ms;
}

void st_model_free(struct st_model *m)
{
	free(m->layers);
	m->layers = NULL;
	m->nlayers = m->cap = 0;
}
