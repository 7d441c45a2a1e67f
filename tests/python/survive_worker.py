"""One rank of a training run under fastreduce.torch.Survivor (test_survive.py).

    survive_worker.py STEPS [--kill R S US] [--grow] [--drop R S]

A 16-32-4 MLP learns a fixed synthetic task with SGD and momentum; each step
is a global minibatch of 48 samples, rank r of n taking its share.  --kill:
rank R (of the job) dies (SIGKILL) US microseconds into step S, from a
thread; the survivors recover (--grow: with the newcomer frrun --respawn
starts).  --drop: rank R leaves cleanly before step S (a split): the clean
run with the same sequence of ranks.  Each rank prints
"FINAL rank=R size=N recoveries=K hash=H" (H: a digest of the parameters'
bytes).
"""

import datetime
import hashlib
import os
import signal
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist

import fastreduce.torch as frt

GB = 48
PORT = os.environ["FR_RENDEZVOUS"].rsplit(":", 1)[1]
# torch's store in a file, one per job (frrun is every rank's parent)
STORE = "file://%s/fr_survive_store_%d_%s" % (tempfile.gettempdir(), os.getppid(), PORT)


def main():
    a = sys.argv[1:]
    steps = int(a[0])
    kill = drop = None
    grow = "--grow" in a
    if "--kill" in a:
        i = a.index("--kill")
        kill = (int(a[i + 1]), int(a[i + 2]), int(a[i + 3]))
    if "--drop" in a:
        i = a.index("--drop")
        drop = (int(a[i + 1]), int(a[i + 2]))
    torch.manual_seed(7)
    torch.set_num_threads(1)
    x = torch.randn(512, 16)
    y = torch.randint(0, 4, (512,))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if not frt.joining():
        dist.init_process_group("fastreduce", init_method=STORE,
                                rank=int(os.environ["FR_RANK"]),
                                world_size=int(os.environ["FR_NRANKS"]),
                                timeout=datetime.timedelta(seconds=60))
    job_rank = int(os.environ["FR_RANK"])
    sv = frt.Survivor(model, opt, grow=grow)

    def closure(ddp, rank, size, step):
        if kill and not frt.joining() and job_rank == kill[0] and step == kill[1]:
            def die():
                time.sleep(kill[2] / 1e6)
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Thread(target=die, daemon=True).start()
        base = (step * GB) % 512
        lo, hi = base + GB * rank // size, base + GB * (rank + 1) // size
        out = ddp(x[lo:hi])
        # scaled so that DDP's average over the ranks is the minibatch mean
        loss = torch.nn.functional.cross_entropy(out, y[lo:hi], reduction="sum") * size / GB
        loss.backward()
        return loss

    step = sv.start_step
    while step < steps:
        if drop and step == drop[1] and not getattr(sv, "_dropped", False):
            sv._dropped = True
            sub = sv.pg.split(-1 if job_rank == drop[0] else 0, sv.rank)
            if sub is None:
                print("LEFT rank=%d" % job_rank, flush=True)
                return
            del sv.ddp
            sv._adopt(sub)
        step = sv.step(step, closure)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    print("FINAL rank=%d size=%d recoveries=%d hash=%s" %
          (sv.rank, sv.size, sv.recoveries, h.hexdigest()[:16]), flush=True)


if __name__ == "__main__":
    main()
