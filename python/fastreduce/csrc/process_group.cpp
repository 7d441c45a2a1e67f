// SPDX-License-Identifier: MIT
//
// process_group.cpp - fastreduce._C: a torch.distributed ProcessGroup
// ("fastreduce") over libfastreduce, for torch 1.13's c10d.
//
// Every call is started at once on the caller's thread with the library's
// non-blocking call (fr_i*), in the order torch makes them (for collectives
// the same order on every rank, as c10d requires).  Two threads per group
// see them finish:
//   - collectives: one waits for them in order (fr_wait, which drives the
//     progress of everything pending; the library completes a group's
//     collectives in order anyway);
//   - send/recv: another polls every pending one (fr_test) and reports
//     each as it finishes, whatever the order: a receive posted early must
//     not hold back the report of a send or collective behind it, or a
//     rank waiting for that report never makes the call its peer needs
//     (pipeline schedules post receives early).  While some are pending it
//     polls for 200 us, then waits 50 us to 1 ms between polls (a new
//     request wakes it at once).
// A finished request's results are copied back (strided tensors, lists) on
// that thread, then its Future is completed and, after it, its Work, on a
// thread of the callback pool below: a Future's callbacks run where it is
// completed, and one may start another collective of this group and wait
// for it (torch's PowerSGD hook does), which would deadlock on the thread
// that waits for the library, or on a fixed pool whose threads all wait
// (torch's inter-op pool has one thread where a rank has one CPU).  So backward
// keeps computing while DDP's buckets move, as with the comm hook.
//
// What a collective needs around the library call (a contiguous copy of a
// strided tensor, one flat buffer for a list of tensors) is made before
// the call; copying the results back happens on the completion thread,
// before the Work completes.  Errors: a call that fails at once throws a
// RuntimeError at the call; one that fails later completes its Work and
// Future with it (wait() rethrows).  The text names the collective, the
// FR_E code and the rank: "fastreduce: allreduce on rank 1 of 4 failed:
// FR_EPEER (-6): ...".
//
// Layer: a client of the public API (include/fastreduce.h) only.

#include <torch/extension.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

extern "C" {
#include <fastreduce.h>
}

namespace fastreduce_torch
{

using c10d::OpType;
using c10d::ProcessGroup;
using c10d::Work;

static std::string fr_message(fr_comm_t *comm, const char *what, int rc)
{
	std::ostringstream s;
	const char *last = fr_comm_last_error(comm);

	s << "fastreduce: " << what;
	if (comm)
		s << " on rank " << fr_comm_rank(comm) << " of "
		  << fr_comm_size(comm);
	s << " failed: " << fr_errname(rc) << " (" << rc
	  << "): " << fr_strerror(rc);
	if (last && *last)
		s << ": " << last;
	return s.str();
}

// torch dtype -> library dtype; throws for the ones it has not.
static fr_dtype_t fr_type(const at::Tensor &t)
{
	switch (t.scalar_type()) {
	case at::kFloat:
		return FR_F32;
	case at::kDouble:
		return FR_F64;
	case at::kHalf:
		return FR_F16;
	case at::kBFloat16:
		return FR_BF16;
	case at::kChar:
		return FR_I8;
	case at::kByte:
	case at::kBool:
		return FR_U8;
	case at::kInt:
		return FR_I32;
	case at::kLong:
		return FR_I64;
	default:
		TORCH_CHECK(
			false, "fastreduce: tensors of dtype ", t.scalar_type(),
			" are not supported (float32/64, float16, bfloat16, "
			"int8, uint8, bool, int32, int64 are)");
	}
}

static fr_op_t fr_reduce_op(const c10d::ReduceOp &op, const at::Tensor &t)
{
	bool is_bool = t.scalar_type() == at::kBool;

	switch (op.op_) {
	case c10d::ReduceOp::SUM:
		// a logical or, as Gloo and NCCL give bool tensors
		return is_bool ? FR_MAX : FR_SUM;
	case c10d::ReduceOp::PRODUCT:
		return is_bool ? FR_MIN : FR_PROD;
	case c10d::ReduceOp::MIN:
		return FR_MIN;
	case c10d::ReduceOp::MAX:
		return FR_MAX;
	case c10d::ReduceOp::AVG:
		TORCH_CHECK(
			at::isFloatingType(t.scalar_type()),
			"fastreduce: ReduceOp.AVG needs a floating-point tensor, not ",
			t.scalar_type());
		return FR_AVG;
	default:
		TORCH_CHECK(
			false, "fastreduce: this ReduceOp (", (int)op.op_,
			") is not supported: SUM, PRODUCT, MIN, MAX and AVG are");
	}
}

static void check_cpu(const at::Tensor &t, const char *what)
{
	TORCH_CHECK(t.device().is_cpu(), "fastreduce: ", what,
		    ": only CPU tensors are supported, got one on ",
		    t.device());
	TORCH_CHECK(!t.is_sparse(), "fastreduce: ", what,
		    ": sparse tensors are not supported");
}

static void check_one(const std::vector<at::Tensor> &ts, const char *what)
{
	TORCH_CHECK(ts.size() == 1, "fastreduce: ", what,
		    " takes exactly one tensor per call (one CPU device), got ",
		    ts.size());
	check_cpu(ts[0], what);
}

// Where Futures are completed (their callbacks run there): a pool that
// starts a thread whenever none is idle, so a callback that waits for
// another Future never waits for a thread; idle threads leave after 10 s.
// One for the process, never freed (its threads may outlive any group).
class CallbackPool
{
      public:
	static CallbackPool &get()
	{
		static CallbackPool *pool = new CallbackPool();
		return *pool;
	}

	void post(std::function<void()> f)
	{
		std::unique_lock<std::mutex> l(mu_);
		if (closing_) {
			// the interpreter is going: a completion run now would
			// reopen the window drain() closed; nobody waits for it
			// any more, and what it holds (tensors) is not ours to
			// drop on this thread (see Graveyard): kept, never run
			new std::function<void()>(std::move(f));
			return;
		}
		q_.push_back(std::move(f));
		if (idle_ > woken_) {
			woken_++;
			cv_.notify_one();
			return;
		}
		std::thread([this] { loop(); }).detach();
	}

	// At the interpreter's exit (an atexit handler, without the GIL):
	// wait until no completion is queued or running.  A waiter wakes when
	// its Future is marked complete, before our thread has left torch's
	// code (a then() callback in Python still holds the GIL's frames);
	// the interpreter would then stop that thread inside it, with a forced
	// unwind that aborts the process ("terminate called without an active
	// exception", about 1 exit in 8 of a test that chains futures).
	bool drain(std::chrono::milliseconds limit)
	{
		std::unique_lock<std::mutex> l(mu_);
		closing_ = true;
		return done_cv_.wait_for(
			l, limit, [&] { return q_.empty() && running_ == 0; });
	}

      private:
	void loop()
	{
		std::unique_lock<std::mutex> l(mu_);
		for (;;) {
			if (q_.empty()) {
				idle_++;
				bool got = cv_.wait_for(
					l, std::chrono::seconds(10),
					[&] { return !q_.empty(); });
				idle_--;
				if (woken_)
					woken_--;
				if (!got)
					return;
			}
			auto f = std::move(q_.front());
			q_.pop_front();
			running_++;
			l.unlock();
			f();
			f = nullptr; // what it held goes with it, still counted
			l.lock();
			if (--running_ == 0 && q_.empty())
				done_cv_.notify_all();
		}
	}

	std::mutex mu_;
	std::condition_variable cv_, done_cv_;
	std::deque<std::function<void()>> q_;
	int idle_ = 0, woken_ = 0, running_ = 0;
	bool closing_ = false; // drain() has begun: post() keeps, never runs
};

// What our threads are done with (Works, the tensors a request used, the
// copy-back closures that hold tensors) is released by a caller's thread
// (the next call, or the group's destruction), never by ours: dropping the
// last reference to a tensor that a Python object belongs to takes the
// GIL, and a thread of ours doing that while the interpreter exits is
// ended by Python with a forced unwind, which aborts the process: the
// likely cause of "terminate called without an active exception" after a
// test's last line, once in about ten runs, gone since.  Never freed either.
class Graveyard
{
      public:
	static Graveyard &get()
	{
		static Graveyard *g = new Graveyard();
		return *g;
	}

	template <class T> void bury(T &&x)
	{
		auto holder = std::make_shared<typename std::decay<T>::type>(
			std::forward<T>(x));
		std::unique_lock<std::mutex> l(mu_);
		dead_.push_back(std::move(holder));
	}

	// On a caller's thread.
	void release()
	{
		std::vector<std::shared_ptr<void>> v;
		{
			std::unique_lock<std::mutex> l(mu_);
			v.swap(dead_);
		}
	}

      private:
	std::mutex mu_;
	std::vector<std::shared_ptr<void>> dead_;
};

// A Work whose completion comes from the completion thread.
class FrWork : public Work
{
      public:
	FrWork(OpType type, std::vector<at::Tensor> outputs)
	    : Work(-1, type), outputs_(std::move(outputs)),
	      future_(c10::make_intrusive<at::ivalue::Future>(
		      c10::ListType::create(c10::TensorType::get())))
	{
	}

	std::vector<at::Tensor> result() override
	{
		return outputs_;
	}

	c10::intrusive_ptr<c10::ivalue::Future> getFuture() override
	{
		return future_;
	}

	// The Future first (after wait(), get_future().value() is there),
	// off the calling thread (see the top of the file).
	static void complete(c10::intrusive_ptr<FrWork> w,
			     std::exception_ptr err)
	{
		CallbackPool::get().post([w, err]() mutable {
			if (err)
				w->future_->setError(err);
			else
				w->future_->markCompleted(
					c10::IValue(w->outputs_));
			w->finish(err);
			Graveyard::get().bury(std::move(w));
		});
	}

      private:
	std::vector<at::Tensor> outputs_;
	c10::intrusive_ptr<at::ivalue::Future> future_;
};

struct Pending {
	fr_request_t *req;
	c10::intrusive_ptr<FrWork> work;
	std::function<void()> after;  // copies back; runs before completion
	std::vector<at::Tensor> keep; // buffers the request reads or writes
	const char *what;
};

class ProcessGroupFastReduce : public ProcessGroup
{
      public:
	ProcessGroupFastReduce(int rank, int size,
			       const std::string &rendezvous,
			       int64_t timeout_ms, const std::string &transport,
			       const std::string &job_token,
			       const std::string &compress, bool error_feedback)
	    : ProcessGroup(rank, size), ef_(error_feedback)
	{
		set_compress(compress);
		fr_config_t cfg;

		fr_config_init(&cfg);
		cfg.rank = rank;
		cfg.nranks = size;
		cfg.rendezvous = rendezvous.c_str();
		if (timeout_ms > 0)
			cfg.timeout_ms =
				(int)std::min<int64_t>(timeout_ms, INT32_MAX);
		if (!transport.empty())
			cfg.transport = transport.c_str();
		if (!job_token.empty())
			cfg.job_token = job_token.c_str();
		int rc;
		{
			py::gil_scoped_release nogil;
			rc = fr_comm_create(&cfg, &comm_);
		}
		if (rc)
			throw std::runtime_error(fr_message(
				nullptr, "creating the communicator", rc));
		start();
	}

	// A group made from another communicator (fr_comm_split); takes it,
	// and the parent's compression settings.
	ProcessGroupFastReduce(fr_comm_t *comm, int compress,
			       bool error_feedback)
	    : ProcessGroup(fr_comm_rank(comm), fr_comm_size(comm)), comm_(comm),
	      compress_(compress), ef_(error_feedback)
	{
		start();
	}

	// Collectives still pending are waited for (they end, at worst with
	// the peer timeout); send/recv still pending are abandoned (a receive
	// nobody matches would wait for ever) and their Works fail.
	~ProcessGroupFastReduce() override
	{
		bool ours =
			std::this_thread::get_id() == coll_thread_.get_id() ||
			std::this_thread::get_id() == p2p_thread_.get_id();

		{
			std::unique_lock<std::mutex> l(mu_);
			stop_ = true;
		}
		cv_.notify_all();
		p2p_cv_.notify_all();
		if (ours) {
			// dropped by a callback on one of our threads: cannot
			// join it; the communicator stays (a leak, not a crash)
			coll_thread_.detach();
			p2p_thread_.detach();
			return;
		}
		{
			// a thread of ours may need the GIL (a Python
			// callback): never join while holding it
			std::unique_ptr<py::gil_scoped_release> nogil;
			if (Py_IsInitialized() && PyGILState_Check())
				nogil.reset(new py::gil_scoped_release());
			coll_thread_.join();
			p2p_thread_.join();
		}
		if (comm_)
			fr_comm_destroy(comm_); // abandons the requests left
		auto gone = std::make_exception_ptr(std::runtime_error(
			"fastreduce: the process group was destroyed before this "
			"send/recv finished"));
		for (auto &p : p2p_left_)
			FrWork::complete(p.work, gone);
		p2p_left_.clear();
		Graveyard::get().release();
	}

	const std::string getBackendName() const override
	{
		return "fastreduce";
	}

	// new_group: a sub-communicator of this one (collective over all its
	// ranks; color < 0: not a member, None comes back).
	c10::intrusive_ptr<ProcessGroupFastReduce> split(int color, int key)
	{
		fr_comm_t *sub = nullptr;
		int rc;

		drain();
		rc = fr_comm_split(comm_, color < 0 ? FR_UNDEFINED : color, key,
				   &sub);
		if (rc)
			throw std::runtime_error(fr_message(
				comm_, "new_group (fr_comm_split)", rc));
		if (!sub)
			return c10::intrusive_ptr<ProcessGroupFastReduce>();
		return c10::make_intrusive<ProcessGroupFastReduce>(
			sub, compress_, ef_);
	}

	// Recovery (fastreduce.survive): the communicator's revoke, agree,
	// failed, shrink and grow, and a newcomer's join.  They work on a
	// failed communicator: the collectives queued fail at once there.
	void revoke()
	{
		fr_comm_revoke(comm_);
	}

	// (code, AND of the survivors' flags, the failed ranks): the code is
	// 0 or FR_EPEER; anything else throws.
	std::tuple<int, uint32_t, std::vector<int>> agree(uint32_t flags)
	{
		std::vector<int> failed;
		int rc, n = 0;

		drain();
		rc = fr_comm_agree(comm_, &flags);
		if (rc && rc != FR_EPEER)
			throw std::runtime_error(
				fr_message(comm_, "fr_comm_agree", rc));
		fr_comm_failed(comm_, nullptr, 0, &n);
		failed.resize((size_t)n);
		if (n)
			fr_comm_failed(comm_, failed.data(), n, &n);
		failed.resize((size_t)n);
		return std::make_tuple(rc, flags, failed);
	}

	c10::intrusive_ptr<ProcessGroupFastReduce> shrink()
	{
		fr_comm_t *nc = nullptr;
		int rc;

		drain();
		rc = fr_comm_shrink(comm_, &nc);
		if (rc)
			throw std::runtime_error(
				fr_message(comm_, "fr_comm_shrink", rc));
		return c10::make_intrusive<ProcessGroupFastReduce>(
			nc, compress_, ef_);
	}

	c10::intrusive_ptr<ProcessGroupFastReduce> grow(int nnew)
	{
		fr_comm_t *nc = nullptr;
		int rc;

		drain();
		rc = fr_comm_grow(comm_, nnew, &nc);
		if (rc)
			throw std::runtime_error(
				fr_message(comm_, "fr_comm_grow", rc));
		return c10::make_intrusive<ProcessGroupFastReduce>(
			nc, compress_, ef_);
	}

	// A newcomer (fr_comm_join): its rank and size come from the grow.
	static c10::intrusive_ptr<ProcessGroupFastReduce>
	join(int64_t timeout_ms, const std::string &transport,
	     const std::string &compress, bool error_feedback)
	{
		fr_config_t cfg;
		fr_comm_t *c = nullptr;
		int rc;

		fr_config_init(&cfg);
		if (timeout_ms > 0)
			cfg.timeout_ms =
				(int)std::min<int64_t>(timeout_ms, INT32_MAX);
		if (!transport.empty())
			cfg.transport = transport.c_str();
		{
			py::gil_scoped_release nogil;
			rc = fr_comm_join(&cfg, &c);
		}
		if (rc)
			throw std::runtime_error(
				fr_message(nullptr, "fr_comm_join", rc));
		auto pg = c10::make_intrusive<ProcessGroupFastReduce>(
			c, 0, error_feedback);
		pg->set_compress(compress);
		return pg;
	}

	c10::intrusive_ptr<Work>
	broadcast(std::vector<at::Tensor> &tensors,
		  const c10d::BroadcastOptions &opts) override
	{
		check_one(tensors, "broadcast");
		at::Tensor t = tensors[0], buf = t.contiguous();
		int root = (int)opts.rootRank;

		return submit(
			OpType::BROADCAST, "broadcast", {t}, {buf},
			[=](fr_request_t **r) {
				return fr_ibroadcast(comm_, buf.data_ptr(),
						     (size_t)buf.numel(),
						     fr_type(buf), root, r);
			},
			copy_back(t, buf));
	}

	c10::intrusive_ptr<Work>
	allreduce(std::vector<at::Tensor> &tensors,
		  const c10d::AllreduceOptions &opts) override
	{
		check_one(tensors, "allreduce");
		at::Tensor t = tensors[0], buf = t.contiguous();
		fr_op_t op = fr_reduce_op(opts.reduceOp, t);

		if (compress_ && t.scalar_type() == at::kFloat &&
		    (op == FR_SUM || op == FR_AVG)) {
			// narrowed on the wire; the residual, per buffer, is
			// added back at the buffer's next All-Reduce
			// (only where the caller's tensor is the buffer: a
			// contiguous copy is new every call)
			at::Tensor res = ef_ && t.is_contiguous()
						 ? residual(t)
						 : at::Tensor();
			int c = compress_;
			return submit(
				OpType::ALLREDUCE, "allreduce", {t}, {buf, res},
				[=](fr_request_t **r) {
					fr_coll_opts_t o;
					fr_coll_opts_init(&o);
					o.compress = c;
					o.residual =
						res.defined()
							? res.data_ptr<float>()
							: nullptr;
					return fr_iallreduce_ex(
						comm_, buf.data_ptr(),
						buf.data_ptr(),
						(size_t)buf.numel(), FR_F32, op,
						&o, r);
				},
				copy_back(t, buf));
		}
		return submit(
			OpType::ALLREDUCE, "allreduce", {t}, {buf},
			[=](fr_request_t **r) {
				return fr_iallreduce(comm_, buf.data_ptr(),
						     buf.data_ptr(),
						     (size_t)buf.numel(),
						     fr_type(buf), op, r);
			},
			copy_back(t, buf));
	}

	c10::intrusive_ptr<Work> allreduce_coalesced(
		std::vector<at::Tensor> &tensors,
		const c10d::AllreduceCoalescedOptions &opts) override
	{
		TORCH_CHECK(!tensors.empty(),
			    "fastreduce: allreduce_coalesced of no tensors");
		for (auto &t : tensors) {
			check_cpu(t, "allreduce_coalesced");
			TORCH_CHECK(
				t.scalar_type() == tensors[0].scalar_type(),
				"fastreduce: allreduce_coalesced needs tensors of one dtype");
		}
		fr_op_t op = fr_reduce_op(opts.reduceOp, tensors[0]);
		at::Tensor flat = at::cat(flatten_views(tensors));
		std::vector<at::Tensor> outs = tensors;

		return submit(
			OpType::ALLREDUCE_COALESCED, "allreduce_coalesced",
			outs, {flat},
			[=](fr_request_t **r) {
				return fr_iallreduce(comm_, flat.data_ptr(),
						     flat.data_ptr(),
						     (size_t)flat.numel(),
						     fr_type(flat), op, r);
			},
			unflatten(outs, flat));
	}

	c10::intrusive_ptr<Work>
	reduce(std::vector<at::Tensor> &tensors,
	       const c10d::ReduceOptions &opts) override
	{
		check_one(tensors, "reduce");
		at::Tensor t = tensors[0], buf = t.contiguous();
		fr_op_t op = fr_reduce_op(opts.reduceOp, t);
		int root = (int)opts.rootRank;
		bool is_root = root == getRank();

		// the other ranks' tensors stay as they were (no receive
		// buffer)
		return submit(
			OpType::REDUCE, "reduce", {t}, {buf},
			[=](fr_request_t **r) {
				return fr_ireduce(comm_, buf.data_ptr(),
						  is_root ? buf.data_ptr()
							  : nullptr,
						  (size_t)buf.numel(),
						  fr_type(buf), op, root, r);
			},
			is_root ? copy_back(t, buf) : nullptr);
	}

	c10::intrusive_ptr<Work>
	allgather(std::vector<std::vector<at::Tensor>> &outputs,
		  std::vector<at::Tensor> &inputs,
		  const c10d::AllgatherOptions &) override
	{
		check_one(inputs, "allgather");
		TORCH_CHECK(outputs.size() == 1 &&
				    (int)outputs[0].size() == getSize(),
			    "fastreduce: allgather needs one list of ",
			    getSize(), " output tensors");
		at::Tensor in = inputs[0].contiguous();
		std::vector<at::Tensor> outs = outputs[0];
		for (auto &o : outs)
			check_same(o, in, "allgather");
		at::Tensor flat = at::empty({(int64_t)getSize() * in.numel()},
					    in.options());

		return submit(
			OpType::ALLGATHER, "allgather", outs, {in, flat},
			[=](fr_request_t **r) {
				return fr_iallgather(
					comm_, in.data_ptr(), flat.data_ptr(),
					(size_t)in.numel(), fr_type(in), r);
			},
			[outs, flat, n = in.numel()]() {
				for (size_t i = 0; i < outs.size(); i++)
					outs[i].copy_(
						flat.narrow(0, (int64_t)i * n,
							    n)
							.view(outs[i].sizes()));
			});
	}

	c10::intrusive_ptr<Work>
	_allgather_base(at::Tensor &output, at::Tensor &input,
			const c10d::AllgatherOptions &) override
	{
		check_cpu(input, "all_gather_into_tensor");
		check_cpu(output, "all_gather_into_tensor");
		TORCH_CHECK(
			output.scalar_type() == input.scalar_type(),
			"fastreduce: all_gather_into_tensor: input and output dtypes differ");
		TORCH_CHECK(
			output.numel() == input.numel() * getSize(),
			"fastreduce: all_gather_into_tensor: the output has ",
			output.numel(), " elements, not world size x input = ",
			input.numel() * getSize());
		at::Tensor in = input.contiguous(), out = output.contiguous();

		return submit(
			OpType::_ALLGATHER_BASE, "all_gather_into_tensor",
			{output}, {in, out},
			[=](fr_request_t **r) {
				return fr_iallgather(
					comm_, in.data_ptr(), out.data_ptr(),
					(size_t)in.numel(), fr_type(in), r);
			},
			copy_back(output, out));
	}

	c10::intrusive_ptr<Work>
	reduce_scatter(std::vector<at::Tensor> &outputs,
		       std::vector<std::vector<at::Tensor>> &inputs,
		       const c10d::ReduceScatterOptions &opts) override
	{
		check_one(outputs, "reduce_scatter");
		TORCH_CHECK(inputs.size() == 1 &&
				    (int)inputs[0].size() == getSize(),
			    "fastreduce: reduce_scatter needs one list of ",
			    getSize(), " input tensors");
		at::Tensor out = outputs[0], buf = out.contiguous();
		for (auto &i : inputs[0])
			check_same(i, out, "reduce_scatter");
		fr_op_t op = fr_reduce_op(opts.reduceOp, out);
		at::Tensor flat = at::cat(flatten_views(inputs[0]));

		return submit(
			OpType::REDUCE_SCATTER, "reduce_scatter", {out},
			{flat, buf},
			[=](fr_request_t **r) {
				return fr_ireduce_scatter(
					comm_, flat.data_ptr(), buf.data_ptr(),
					(size_t)buf.numel(), fr_type(buf), op,
					r);
			},
			copy_back(out, buf));
	}

	c10::intrusive_ptr<Work>
	_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
			     const c10d::ReduceScatterOptions &opts) override
	{
		check_cpu(input, "reduce_scatter_tensor");
		check_cpu(output, "reduce_scatter_tensor");
		TORCH_CHECK(
			output.scalar_type() == input.scalar_type(),
			"fastreduce: reduce_scatter_tensor: input and output dtypes differ");
		TORCH_CHECK(input.numel() == output.numel() * getSize(),
			    "fastreduce: reduce_scatter_tensor: the input has ",
			    input.numel(),
			    " elements, not world size x output = ",
			    output.numel() * getSize());
		fr_op_t op = fr_reduce_op(opts.reduceOp, output);
		at::Tensor in = input.contiguous(), out = output.contiguous();

		return submit(
			OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor",
			{output}, {in, out},
			[=](fr_request_t **r) {
				return fr_ireduce_scatter(comm_, in.data_ptr(),
							  out.data_ptr(),
							  (size_t)out.numel(),
							  fr_type(out), op, r);
			},
			copy_back(output, out));
	}

	c10::intrusive_ptr<Work> barrier(const c10d::BarrierOptions &) override
	{
		return submit(
			OpType::BARRIER, "barrier", {}, {},
			[=](fr_request_t **r) { return fr_ibarrier(comm_, r); },
			nullptr);
	}

	c10::intrusive_ptr<Work>
	alltoall_base(at::Tensor &output, at::Tensor &input,
		      std::vector<int64_t> &outSplits,
		      std::vector<int64_t> &inSplits,
		      const c10d::AllToAllOptions &) override
	{
		const char *what = "all_to_all_single";
		int n = getSize();

		check_cpu(input, what);
		check_cpu(output, what);
		TORCH_CHECK(
			output.scalar_type() == input.scalar_type(),
			"fastreduce: all_to_all_single: input and output dtypes differ");
		at::Tensor in = input.contiguous(), out = output.contiguous();
		if (outSplits.empty() && inSplits.empty()) {
			TORCH_CHECK(
				in.numel() % n == 0 &&
					out.numel() == in.numel(),
				"fastreduce: all_to_all_single without splits needs equal "
				"input and output sizes divisible by the world size (",
				in.numel(), ", ", out.numel(), ")");
			size_t count = (size_t)(in.numel() / n);
			return submit(
				OpType::ALLTOALL_BASE, what, {output},
				{in, out},
				[=](fr_request_t **r) {
					return fr_ialltoall(
						comm_, in.data_ptr(),
						out.data_ptr(), count,
						fr_type(in), r);
				},
				copy_back(output, out));
		}
		std::vector<size_t> sc = split_counts(in, inSplits, "input"),
				    rc = split_counts(out, outSplits, "output");
		return alltoallv(OpType::ALLTOALL_BASE, what, {output}, in, out,
				 sc, rc, copy_back(output, out));
	}

	c10::intrusive_ptr<Work>
	alltoall(std::vector<at::Tensor> &outputs,
		 std::vector<at::Tensor> &inputs,
		 const c10d::AllToAllOptions &) override
	{
		const char *what = "all_to_all";
		int n = getSize();

		TORCH_CHECK((int)outputs.size() == n && (int)inputs.size() == n,
			    "fastreduce: all_to_all needs ", n, " input and ",
			    n, " output tensors, got ", inputs.size(), " and ",
			    outputs.size());
		for (int i = 0; i < n; i++) {
			check_same_type(inputs[i], inputs[0], what);
			check_same_type(outputs[i], inputs[0], what);
		}
		std::vector<size_t> sc(n), rc(n);
		for (int i = 0; i < n; i++) {
			sc[i] = (size_t)inputs[i].numel();
			rc[i] = (size_t)outputs[i].numel();
		}
		at::Tensor in = at::cat(flatten_views(inputs));
		at::Tensor out =
			at::empty({(int64_t)sum(rc)}, inputs[0].options());
		std::vector<at::Tensor> outs = outputs;
		return alltoallv(OpType::ALLTOALL, what, outs, in, out, sc, rc,
				 unflatten(outs, out));
	}

	// gather and scatter: an all-to-all-v in which only the root's row or
	// column has anything (empty blocks cost nothing on the wire).
	c10::intrusive_ptr<Work>
	gather(std::vector<std::vector<at::Tensor>> &outputs,
	       std::vector<at::Tensor> &inputs,
	       const c10d::GatherOptions &opts) override
	{
		const char *what = "gather";
		int n = getSize(), root = (int)opts.rootRank, me = getRank();

		check_one(inputs, what);
		at::Tensor in = inputs[0].contiguous();
		std::vector<at::Tensor> outs;
		if (me == root) {
			TORCH_CHECK(
				outputs.size() == 1 &&
					(int)outputs[0].size() == n,
				"fastreduce: gather needs, on the root, one list of ",
				n, " output tensors");
			outs = outputs[0];
			for (auto &o : outs)
				check_same(o, in, what);
		} else {
			TORCH_CHECK(
				outputs.empty() || (outputs.size() == 1 &&
						    outputs[0].empty()),
				"fastreduce: gather takes output tensors on the root only");
		}
		std::vector<size_t> sc(n, 0), rc(n, 0);
		sc[root] = (size_t)in.numel();
		if (me == root)
			std::fill(rc.begin(), rc.end(), (size_t)in.numel());
		at::Tensor out = at::empty({(int64_t)sum(rc)}, in.options());
		return alltoallv(OpType::GATHER, what, outs, in, out, sc, rc,
				 unflatten(outs, out));
	}

	c10::intrusive_ptr<Work>
	scatter(std::vector<at::Tensor> &outputs,
		std::vector<std::vector<at::Tensor>> &inputs,
		const c10d::ScatterOptions &opts) override
	{
		const char *what = "scatter";
		int n = getSize(), root = (int)opts.rootRank, me = getRank();

		check_one(outputs, what);
		at::Tensor o = outputs[0];
		at::Tensor in;
		if (me == root) {
			TORCH_CHECK(
				inputs.size() == 1 &&
					(int)inputs[0].size() == n,
				"fastreduce: scatter needs, on the root, one list of ",
				n, " input tensors");
			for (auto &i : inputs[0])
				check_same(i, o, what);
			in = at::cat(flatten_views(inputs[0]));
		} else {
			TORCH_CHECK(
				inputs.empty() || (inputs.size() == 1 &&
						   inputs[0].empty()),
				"fastreduce: scatter takes input tensors on the root only");
			in = at::empty({0}, o.options());
		}
		std::vector<size_t> sc(n, 0), rc(n, 0);
		rc[root] = (size_t)o.numel();
		if (me == root)
			std::fill(sc.begin(), sc.end(), (size_t)o.numel());
		at::Tensor out = o.contiguous();
		return alltoallv(OpType::SCATTER, what, {o}, in, out, sc, rc,
				 copy_back(o, out));
	}

	c10::intrusive_ptr<Work> send(std::vector<at::Tensor> &tensors, int dst,
				      int tag) override
	{
		check_one(tensors, "send");
		at::Tensor buf = tensors[0].contiguous();

		return submit(
			OpType::SEND, "send", {}, {buf},
			[=](fr_request_t **r) {
				return fr_isend(comm_, buf.data_ptr(),
						(size_t)buf.numel(),
						fr_type(buf), dst, tag, r);
			},
			nullptr, true);
	}

	c10::intrusive_ptr<Work> recv(std::vector<at::Tensor> &tensors, int src,
				      int tag) override
	{
		check_one(tensors, "recv");
		at::Tensor t = tensors[0], buf = t.contiguous();

		return submit(
			OpType::RECV, "recv", {t}, {buf},
			[=](fr_request_t **r) {
				return fr_irecv(comm_, buf.data_ptr(),
						(size_t)buf.numel(),
						fr_type(buf), src, tag, r);
			},
			copy_back(t, buf), true);
	}

	c10::intrusive_ptr<Work> recvAnysource(std::vector<at::Tensor> &,
					       int) override
	{
		TORCH_CHECK(
			false,
			"fastreduce: recv from any source is not supported: "
			"name the sender (dist.recv(tensor, src=...))");
	}

      private:
	static size_t sum(const std::vector<size_t> &v)
	{
		size_t s = 0;
		for (size_t x : v)
			s += x;
		return s;
	}

	// Split sizes (rows of dim 0) -> element counts per rank.
	std::vector<size_t> split_counts(const at::Tensor &t,
					 const std::vector<int64_t> &splits,
					 const char *side)
	{
		int n = getSize();
		int64_t rows = t.dim() ? t.size(0) : 1,
			row = rows ? t.numel() / rows : 0, total = 0;
		std::vector<size_t> c(n);

		if (splits.empty()) {
			TORCH_CHECK(rows % n == 0,
				    "fastreduce: all_to_all_single: the ", side,
				    "'s first dimension (", rows,
				    ") is not divisible by the world size");
			for (int i = 0; i < n; i++)
				c[i] = (size_t)(rows / n * row);
			return c;
		}
		TORCH_CHECK((int)splits.size() == n,
			    "fastreduce: all_to_all_single: ", side,
			    "_split_sizes has ", splits.size(),
			    " entries, not ", n);
		for (int i = 0; i < n; i++) {
			TORCH_CHECK(
				splits[i] >= 0,
				"fastreduce: all_to_all_single: a negative split");
			c[i] = (size_t)(splits[i] * row);
			total += splits[i];
		}
		TORCH_CHECK(total == rows,
			    "fastreduce: all_to_all_single: the ", side,
			    " splits add up to ", total,
			    " rows, the tensor has ", rows);
		return c;
	}

	c10::intrusive_ptr<Work>
	alltoallv(OpType type, const char *what, std::vector<at::Tensor> outs,
		  const at::Tensor &in, const at::Tensor &out,
		  const std::vector<size_t> &sc, const std::vector<size_t> &rc,
		  std::function<void()> after)
	{
		int n = getSize();
		std::vector<size_t> sd(n), rd(n);

		for (int i = 1; i < n; i++) {
			sd[i] = sd[i - 1] + sc[i - 1];
			rd[i] = rd[i - 1] + rc[i - 1];
		}
		// the library copies the arrays into its request
		return submit(
			type, what, std::move(outs), {in, out},
			[=](fr_request_t **r) {
				return fr_ialltoallv(comm_, in.data_ptr(),
						     sc.data(), sd.data(),
						     out.data_ptr(), rc.data(),
						     rd.data(), fr_type(in), r);
			},
			std::move(after));
	}

	// After the request: a flat buffer back into a list of tensors.
	static std::function<void()>
	unflatten(const std::vector<at::Tensor> &outs, const at::Tensor &flat)
	{
		return [outs, flat]() {
			int64_t off = 0;
			for (auto t : outs) {
				t.copy_(flat.narrow(0, off, t.numel())
						.view(t.sizes()));
				off += t.numel();
			}
		};
	}

	static void check_same_type(const at::Tensor &t, const at::Tensor &ref,
				    const char *what)
	{
		check_cpu(t, what);
		TORCH_CHECK(t.scalar_type() == ref.scalar_type(),
			    "fastreduce: ", what,
			    ": every tensor must have the dtype of the first (",
			    ref.scalar_type(), ")");
	}

	void set_compress(const std::string &name)
	{
		fr_compress_t c = FR_COMPRESS_NONE;

		if (!name.empty() && fr_compress_from_name(name.c_str(), &c))
			throw std::invalid_argument(
				"fastreduce: unknown compression \"" + name +
				"\" (none, bf16, fp16, int8)");
		compress_ = (int)c;
	}

	// The error-feedback residual of the tensor at buf's address (DDP's
	// buckets keep their flat buffers for the whole run): the same memory
	// (storage) and size finds its residual, anything else starts from
	// zero, and the residuals of freed memory are dropped.
	at::Tensor residual(const at::Tensor &buf)
	{
		std::unique_lock<std::mutex> l(mu_);
		auto key = (uintptr_t)buf.data_ptr();
		c10::StorageImpl *owner = buf.storage().unsafeGetStorageImpl();

		for (auto it = residuals_.begin(); it != residuals_.end();)
			if (it->second.owner.expired())
				it = residuals_.erase(it);
			else
				++it;
		auto it = residuals_.find(key);
		if (it != residuals_.end() &&
		    it->second.r.numel() == buf.numel() &&
		    it->second.owner.lock().get() == owner)
			return it->second.r;
		Residual x{buf.storage().getWeakStorageImpl(),
			   at::zeros({buf.numel()}, at::kFloat)};
		residuals_.erase(key);
		residuals_.emplace(key, x);
		return x.r;
	}

	// The tensors' data as one flat list of views (for at::cat).
	static std::vector<at::Tensor>
	flatten_views(const std::vector<at::Tensor> &ts)
	{
		std::vector<at::Tensor> v;
		v.reserve(ts.size());
		for (auto &t : ts)
			v.push_back(t.reshape({-1}));
		return v;
	}

	static void check_same(const at::Tensor &t, const at::Tensor &ref,
			       const char *what)
	{
		check_cpu(t, what);
		TORCH_CHECK(t.scalar_type() == ref.scalar_type() &&
				    t.numel() == ref.numel(),
			    "fastreduce: ", what,
			    ": every tensor must have the dtype and size of ",
			    "the input (", ref.scalar_type(), ", ", ref.numel(),
			    " elements)");
	}

	// After the request: the result into a tensor that was not contiguous.
	static std::function<void()> copy_back(const at::Tensor &t,
					       const at::Tensor &buf)
	{
		if (t.is_same(buf))
			return nullptr;
		return [t, buf]() mutable { t.copy_(buf); };
	}

	c10::intrusive_ptr<Work>
	submit(OpType type, const char *what, std::vector<at::Tensor> outs,
	       std::vector<at::Tensor> keep,
	       const std::function<int(fr_request_t **)> &start,
	       std::function<void()> after, bool p2p = false)
	{
		Graveyard::get().release();
		auto work = c10::make_intrusive<FrWork>(type, std::move(outs));
		fr_request_t *req = nullptr;
		int rc = start(&req);

		if (rc)
			throw std::runtime_error(fr_message(comm_, what, rc));
		{
			std::unique_lock<std::mutex> l(mu_);
			(p2p ? p2p_queue_ : queue_)
				.push_back(Pending{req, work, std::move(after),
						   std::move(keep), what});
		}
		(p2p ? p2p_cv_ : cv_).notify_all();
		return work;
	}

	// Wait until every collective started so far has completed (send
	// and recv may stay pending: a split does not wait for them).
	void drain()
	{
		std::unique_lock<std::mutex> l(mu_);
		idle_cv_.wait(l, [&] { return queue_.empty() && !busy_; });
	}

	void start()
	{
		coll_thread_ = std::thread([this] { run(); });
		p2p_thread_ = std::thread([this] { run_p2p(); });
	}

	// A finished request: copy back, then complete its Work.
	void finished(Pending &p, int rc)
	{
		std::exception_ptr err;

		if (rc) {
			err = std::make_exception_ptr(std::runtime_error(
				fr_message(comm_, p.what, rc)));
		} else if (p.after) {
			try {
				p.after();
			} catch (...) {
				err = std::current_exception();
			}
		}
		FrWork::complete(p.work, err);
	}

	void run_p2p()
	{
		// results are copied into the callers' tensors, which may be
		// parameters that require grad: outside autograd, as the
		// caller's own thread would be (grad mode is per thread)
		at::NoGradGuard no_grad;
		std::vector<Pending> live;
		uint64_t idle_since = 0;
		int nap_us = 50;

		for (;;) {
			{
				std::unique_lock<std::mutex> l(mu_);
				if (live.empty()) {
					p2p_cv_.wait(l, [&] {
						return stop_ ||
						       !p2p_queue_.empty();
					});
				} else if (idle_since &&
					   now_us() - idle_since > 200) {
					p2p_cv_.wait_for(
						l,
						std::chrono::microseconds(
							nap_us),
						[&] {
							return stop_ ||
							       !p2p_queue_
									.empty();
						});
					nap_us = std::min(2 * nap_us, 1000);
				}
				if (stop_) {
					for (auto &p : p2p_queue_)
						live.push_back(std::move(p));
					p2p_queue_.clear();
					p2p_left_ = std::move(live);
					return;
				}
				for (auto &p : p2p_queue_)
					live.push_back(std::move(p));
				p2p_queue_.clear();
			}
			bool any = false;
			for (size_t i = 0; i < live.size();) {
				int done = 0, rc = fr_test(&live[i].req, &done);

				if (!done && !rc) {
					i++;
					continue;
				}
				finished(live[i], rc);
				Graveyard::get().bury(std::move(live[i]));
				live.erase(live.begin() + (long)i);
				any = true;
			}
			if (any || live.empty()) {
				idle_since = 0;
				nap_us = 50;
			} else if (!idle_since) {
				idle_since = now_us();
			} else {
				std::this_thread::yield();
			}
		}
	}

	static uint64_t now_us()
	{
		return (uint64_t)
			std::chrono::duration_cast<std::chrono::microseconds>(
				std::chrono::steady_clock::now()
					.time_since_epoch())
				.count();
	}

	void run()
	{
		at::NoGradGuard no_grad; // as in run_p2p()
		for (;;) {
			Pending p;
			{
				std::unique_lock<std::mutex> l(mu_);
				cv_.wait(l, [&] {
					return stop_ || !queue_.empty();
				});
				if (queue_.empty())
					return; // stopping, nothing left
				p = std::move(queue_.front());
				queue_.pop_front();
				busy_ = true;
			}
			finished(p, fr_wait(&p.req));
			Graveyard::get().bury(std::move(p));
			{
				std::unique_lock<std::mutex> l(mu_);
				busy_ = false;
			}
			idle_cv_.notify_all();
		}
	}

	fr_comm_t *comm_ = nullptr;
	int compress_ = FR_COMPRESS_NONE; // pg_options: f32 SUM/AVG All-Reduces
	bool ef_ = true;
	struct Residual {
		c10::weak_intrusive_ptr<c10::StorageImpl> owner;
		at::Tensor r;
	};
	std::unordered_map<uintptr_t, Residual> residuals_;
	std::mutex mu_;
	std::condition_variable cv_, idle_cv_, p2p_cv_;
	std::deque<Pending> queue_;	// collectives, in order
	std::deque<Pending> p2p_queue_; // send/recv not yet polled
	std::vector<Pending> p2p_left_; // pending when the group went away
	bool stop_ = false, busy_ = false;
	std::thread coll_thread_, p2p_thread_;
};

} // namespace fastreduce_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
	using namespace fastreduce_torch;

	py::module::import("torch.distributed");
	py::class_<ProcessGroupFastReduce, c10d::ProcessGroup,
		   c10::intrusive_ptr<ProcessGroupFastReduce>>(
		m, "ProcessGroupFastReduce")
		.def(py::init<int, int, const std::string &, int64_t,
			      const std::string &, const std::string &,
			      const std::string &, bool>(),
		     py::arg("rank"), py::arg("size"), py::arg("rendezvous"),
		     py::arg("timeout_ms") = 0, py::arg("transport") = "",
		     py::arg("job_token") = "", py::arg("compress") = "",
		     py::arg("error_feedback") = true)
		.def("split", &ProcessGroupFastReduce::split, py::arg("color"),
		     py::arg("key"), py::call_guard<py::gil_scoped_release>())
		.def("revoke", &ProcessGroupFastReduce::revoke,
		     py::call_guard<py::gil_scoped_release>())
		.def("agree", &ProcessGroupFastReduce::agree, py::arg("flags"),
		     py::call_guard<py::gil_scoped_release>())
		.def("shrink", &ProcessGroupFastReduce::shrink,
		     py::call_guard<py::gil_scoped_release>())
		.def("grow", &ProcessGroupFastReduce::grow, py::arg("nnew"),
		     py::call_guard<py::gil_scoped_release>())
		.def_static("join", &ProcessGroupFastReduce::join,
			    py::arg("timeout_ms") = 0,
			    py::arg("transport") = "", py::arg("compress") = "",
			    py::arg("error_feedback") = true);
	m.attr("FR_VERSION") = fr_version();
	// runs before the interpreter stops other threads (see drain())
	py::module::import("atexit").attr("register")(py::cpp_function([]() {
		py::gil_scoped_release nogil;
		CallbackPool::get().drain(std::chrono::seconds(30));
	}));
}
