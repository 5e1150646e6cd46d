"""The torch-free core API: torchrun --nproc-per-node 3 examples/core_api.py

weft.Communicator works on numpy arrays and CPU torch tensors; it meets its peers through any
torch.distributed store. Each rank checks its results against numpy.
"""

import numpy as np
import torch.distributed as dist
import weft

store, rank, world_size = next(dist.rendezvous("env://"))  # torchrun's; any Store works
comm = weft.Communicator(store, rank, world_size, name="main", timeout=60)

x = np.full(1 << 20, rank + 1, dtype=np.float32)
comm.allreduce(x)  # in place; op="sum"|"prod"|"min"|"max"|"avg"
y = comm.allgather(x[:1000])  # a new array; out= reuses one
h = comm.reduce_scatter(y, op="max", async_=True)  # every call has an async_ form
part = h.wait(timeout=10)  # a Handle: wait(timeout), test()

total = world_size * (world_size + 1) / 2
assert np.all(x == total) and y.shape == (1000 * world_size,), (x[:4], y.shape)
assert part.shape == (1000,) and np.all(part == total), part[:4]
comm.barrier()
print(f"rank {rank}: ok")
