"""Run by test_topo_file_algo.py under torchrun with WEFT_ALGO=file:<an in-place allreduce>:
weft's all_reduce against gloo's on the same inputs, at sizes the file divides (which must run
the file's Algorithm) and one it does not (weft's own choice), and broadcast beside it."""

import torch
import torch.distributed as dist
import weft  # noqa: F401 - registers the backend
from weft.topo import file_algo


def main():
    dist.init_process_group("weft")
    gloo = dist.new_group(backend="gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    for count, dtype in (
        (6, torch.float32),
        (6 * 1031, torch.float64),
        (6 * 4099, torch.int32),
        (7, torch.float32),
    ):
        gen = torch.Generator().manual_seed(count * 10 + rank)
        x = torch.randint(-1000, 1000, (count,), generator=gen).to(dtype)
        ours, theirs = x.clone(), x.clone()
        dist.all_reduce(ours)
        dist.all_reduce(theirs, group=gloo)
        assert torch.equal(ours, theirs), (count, ours[:8], theirs[:8])
        b = x.clone()
        dist.broadcast(b, src=1)
    ran = sorted(count for (collective, count), n in file_algo.RUNS.items() if n)
    print(f"rank {rank}/{size}: file ran at {ran}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
