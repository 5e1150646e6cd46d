"""Run by test_backend_init.py under torchrun: init_process_group("weft") from the environment,
an allreduce, and a few DDP steps whose parameters must agree on every rank."""

import torch
import torch.distributed as dist
import weft  # noqa: F401 - registers the backend


def main():
    dist.init_process_group("weft")
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [size * (size + 1) / 2] * 4, t

    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        gen = torch.Generator().manual_seed(step * 10 + rank)
        opt.zero_grad()
        ddp(torch.randn(8, 5, generator=gen)).square().mean().backward()
        opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(params) for _ in range(size)]
    dist.all_gather(everyone, params)
    assert all(torch.equal(everyone[0], p) for p in everyone)
    print(f"rank {rank}/{size}: {dist.get_backend()} ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
