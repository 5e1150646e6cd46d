"""weft as a torch.distributed backend: torchrun --nproc-per-node 3 examples/torch_backend.py

Each rank checks its results against what the collectives must give, and exits non-zero if one
is wrong.
"""

import torch
import torch.distributed as dist
import weft  # noqa: F401  (registers the backend "weft")

dist.init_process_group("weft")  # env:// from torchrun; "cpu:weft,cuda:nccl" mixes backends
rank, size = dist.get_rank(), dist.get_world_size()

t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)  # every torch.distributed call works as it does over gloo
gathered = [torch.empty(4) for _ in range(size)]
dist.all_gather(gathered, t)
work = dist.broadcast(t, src=0, async_op=True)
work.wait()

expected = size * (size + 1) / 2
assert torch.equal(t, torch.full((4,), expected)), t
assert all(torch.equal(g, t) for g in gathered), gathered
dist.destroy_process_group()
print(f"rank {rank}: ok")
