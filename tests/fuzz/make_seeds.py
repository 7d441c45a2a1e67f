#!/usr/bin/env python3
"""Write the seed corpora (tests/fuzz/corpus/<harness>/): a few valid and
near-valid inputs per decoder, so that fuzzing starts from the formats
instead of having to discover the magic numbers.  Run from anywhere; the
seeds are committed, rerun this after a wire format changes."""
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))


def put(h, name, data):
    d = os.path.join(here, "corpus", h)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# msg: room byte (x64 bytes of payload), then a 64-byte mailbox header
def msg(typ, coll=0, seq=7, count=33, ln=0, err=0, origin=0):
    h = struct.pack("<IBBBBBBHIQiIQIiiI", 0x314D5246, typ, coll, 0, 9, 0, 0, 0,
                    seq, count, -1, 4, 0, ln, err, origin, 0)
    return h + bytes(64 - len(h))


for t in range(1, 5):
    put("msg", "type%d" % t, bytes([16]) + msg(t, ln=100))
put("msg", "abort", bytes([16]) + msg(3, ln=40, err=-1, origin=3))
put("msg", "toolong", bytes([1]) + msg(1, ln=65))


# the 16-byte header of a small message (peer.c), its payload behind it
def compact(typ, credits=2, ln=8, root=0, seq=7, count=2):
    h = struct.pack("<BBBBBBBBHHI", 0xC1, typ << 4 | credits, 1, 2, 9, 0, ln,
                    root, 0, count, seq)
    return h + bytes(range(ln))


put("msg", "compact_data", bytes([16]) + compact(1))
put("msg", "compact_ready", bytes([16]) + compact(2, ln=0))
put("msg", "compact_toolong", bytes([16]) + compact(1, ln=17))

# boot: selector, then the message
hdr = struct.pack("<IHHI", 0x31425246, 1, 1, 40)
put("boot", "header", b"\x00" + hdr)


def s16(b):
    return struct.pack("<H", len(b)) + b


hello = struct.pack("<II", 1, 4) + s16(b"token") + s16(b"cfg=1") + s16(bytes(range(28)))
put("boot", "hello", b"\x01" + hello)
welcome = struct.pack("<QI", 0x1234, 2) + s16(bytes(28)) + s16(bytes(range(28)))
put("boot", "welcome", b"\x02" + bytes([1]) + welcome)
put("boot", "reject", b"\x03" + struct.pack("<i", -13) + s16(b"wrong job token\x01"))

# rkey: selector (0 tcp, 1 shm, 2 shm+tcp, 3 verbs, 4 address), then the blob
tcp = struct.pack("<BBHIIQ", 0xFC, 1, 0, 3, 1, 4096)
# version: the shm transport's SHM_VERSION (fr_shm.c)
shm = struct.pack("<BBHIIQQ", 0xFE, 4, 0, 3, 1, 4096, 0x7F0000001000)
put("rkey", "tcp", b"\x00" + tcp)
put("rkey", "shm", b"\x01" + shm)
put("rkey", "mux", b"\x02" + bytes([len(tcp)]) + tcp + shm)
put("rkey", "verbs", b"\x03" + bytes(range(40)))
addr = struct.pack("<BBBBHHI", 0xFA, 1, 4, 0, 4000, 0, 0) + bytes([127, 0, 0, 1]) + bytes(12)
put("rkey", "addr4", b"\x04" + addr)
addr6 = struct.pack("<BBBBHHI", 0xFA, 1, 6, 0, 4000, 0, 0) + bytes(15) + b"\x01"
put("rkey", "addr6", b"\x04" + addr6)


# tcp: odd selector = valid hello first, then 32-byte write headers + payload
def wr(imm, region, gen, off, payload):
    return struct.pack("<BBHIIIQII", 1, 1, 0, imm, region, gen, off, len(payload), 0) + payload


put("tcp", "writes", b"\x01" + wr(5, 0, 1, 0, b"x" * 64) + wr(6, 0, 0, 0, b"") +
    wr(7, 0, 1, 4032, b"y" * 64))
put("tcp", "outside", b"\x01" + wr(5, 0, 1, 4090, b"z" * 16))
put("tcp", "noaccess", b"\x01" + wr(5, 1, 1, 0, b"z" * 16))
hello_tcp = struct.pack("<IHHiIQ", 0x43545246, 1, 1, 2, 0, 0x0123456789ABCDEF)
put("tcp", "hello", b"\x00" + hello_tcp + wr(1, 0, 1, 0, b"a" * 8))
put("tcp", "badnonce", b"\x00" + hello_tcp[:16] + bytes(8))

# tune: the file
put("tune", "full", b"# fr_tune\ntcp.alpha_us = 25.5\ntcp.beta_ns = 2\n"
    b"tcp.copy_ns = 0.2\nshm.alpha_us = 1.5\ngamma_ns.f32 = 0.15\ngamma_ns.bf16 = 0.3\n")
put("tune", "bad", b"tcp.alpha_us = -1\nfoo = bar baz\n")

# env: even selector = environment lines; odd = PMI server answers
put("env", "frrun", b"\x00FR_RANK=1\nFR_NRANKS=4\nFR_RENDEZVOUS=127.0.0.1:29500\n"
    b"FR_TIMEOUT_MS=3000\nFR_SEGMENT_BYTES=512K\nFR_LOCAL_SIZE=4\n")
put("env", "ompi", b"\x00OMPI_COMM_WORLD_RANK=0\nOMPI_COMM_WORLD_SIZE=2\n"
    b"OMPI_COMM_WORLD_LOCAL_SIZE=2\nFR_RENDEZVOUS=[::1]:4000\n")
put("env", "slurm", b"\x00SLURM_PROCID=3\nSLURM_NTASKS=8\nSLURM_NNODES=2\n"
    b"SLURM_STEP_NODELIST=node[01-02,7]\nSLURM_JOB_NODELIST=a,b\n")
put("env", "torchrun", b"\x00RANK=1\nWORLD_SIZE=2\nMASTER_ADDR=localhost\nMASTER_PORT=29500\n"
    b"LOCAL_WORLD_SIZE=2\n")
put("env", "pmix", b"\x00OMPI_COMM_WORLD_RANK=1\nOMPI_COMM_WORLD_SIZE=4\n"
    b"OMPI_COMM_WORLD_LOCAL_SIZE=2\nPMIX_NAMESPACE=prterun-a-1@1\nPMIX_RANK=1\nFR_PMIX=1\n"
    b"FR_PMIX_HOST=a\n")
put("env", "names", b"\x00A=f32\nB=bfloat16\nC=avg\nD=rabenseifner\nE=64K\nF=-3\nG=host:1\n")
put("env", "pmi", b"\x01cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"
    b"cmd=my_kvsname kvsname=kvs_42_0\ncmd=put_result rc=0\ncmd=barrier_out\n"
    b"cmd=get_result rc=0 value=10.0.0.1:20001\ncmd=finalize_ack\n")
put("env", "pmi1", b"\x03cmd=response_to_init rc=0\ncmd=my_kvsname kvsname=k\n"
    b"cmd=barrier_out\ncmd=get_result rc=0 value=host:1\ncmd=finalize_ack\n")
