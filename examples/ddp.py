"""weft.DistributedDataParallel: torchrun --nproc-per-node 3 examples/ddp.py

Trains a linear model with bf16 gradient compression, then checks that every rank ended with
the same parameters. With --checkpoint PATH, rank 0 saves the model, the optimizer and the step
to PATH every --save-every steps and at the end, and a run that finds PATH resumes from it: under
`torchrun --max-restarts 1`, a worker killed mid-training costs only the steps since the last
save, and the final model is the one an uninterrupted run ends with (each step's batches are
drawn from the step and the rank, so a resumed step sees the same data).
examples/train_digits.py is a whole training run.
"""

import argparse
import os

import torch
import torch.distributed as dist
import weft

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--checkpoint", help="where to save, and to resume from when it exists")
parser.add_argument("--save-every", type=int, default=10)
args = parser.parse_args()

torch.manual_seed(0)  # the same initial model everywhere (DDP broadcasts rank 0's anyway)
net = torch.nn.Linear(64, 10)
# A "weft" process group is made from torchrun's environment when none exists yet.
model = weft.DistributedDataParallel(net, compression="bf16")  # or "fp16"; off by default
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

rank = dist.get_rank()
first = 0
if args.checkpoint and os.path.exists(args.checkpoint):
    state = torch.load(args.checkpoint)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    first = state["step"]
    print(f"rank {rank}: resumed from step {first}", flush=True)


def save(step: int) -> None:
    if rank == 0:  # written aside, then renamed: a kill never leaves half a checkpoint
        state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        torch.save(state, args.checkpoint + ".tmp")
        os.replace(args.checkpoint + ".tmp", args.checkpoint)


for step in range(first, args.steps):
    batches = torch.Generator().manual_seed(1000 * step + rank)  # every rank its own batches
    x, y = torch.randn(32, 64, generator=batches), torch.randint(0, 10, (32,), generator=batches)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()  # gradients averaged over ranks
    optimizer.step()
    if args.checkpoint and ((step + 1) % args.save_every == 0 or step + 1 == args.steps):
        save(step + 1)

weights = [torch.empty_like(model.module.weight) for _ in range(dist.get_world_size())]
dist.all_gather(weights, model.module.weight.detach())
assert all(torch.equal(w, weights[0]) for w in weights), "ranks ended with different models"
dist.destroy_process_group()
print(f"rank {rank}: ok")
