"""The README's DDP example: PyTorch DDP with libfastreduce for the
gradients.  Run on 4 ranks from build/:

    ./frrun -n 4 /usr/bin/python3 ../python/example_ddp.py [bf16|int8]
"""
import sys

import torch, torch.nn as nn, torch.distributed as dist
import fastreduce.torch as frt

frt.init_process_group()                  # Gloo, for DDP's own setup
torch.manual_seed(dist.get_rank())   # each rank its own data (DDP syncs the weights)
model = nn.parallel.DistributedDataParallel(nn.Linear(64, 10))
state = frt.FastReduceState(compress=sys.argv[1] if len(sys.argv) > 1 else None)
model.register_comm_hook(state, frt.allreduce_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    x = torch.randn(32, 64)
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
if dist.get_rank() == 0:
    st = state.comm.stats()
    print("rank 0: loss %.6f after 100 steps over %d ranks (%s), %d buckets, "
          "%d wire bytes" % (loss.item(), dist.get_world_size(), state.comm.transport,
                             state.buckets, st["wire_bytes"]))
state.close()
dist.destroy_process_group()
