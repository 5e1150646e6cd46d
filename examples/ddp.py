"""weft.DistributedDataParallel: torchrun --nproc-per-node 3 examples/ddp.py

Trains a linear model for a few steps with bf16 gradient compression, then checks that every
rank ended with the same parameters. examples/train_digits.py is a whole training run.
"""

import torch
import torch.distributed as dist
import weft

torch.manual_seed(0)  # the same initial model everywhere (DDP broadcasts rank 0's anyway)
net = torch.nn.Linear(64, 10)
# A "weft" process group is made from torchrun's environment when none exists yet.
model = weft.DistributedDataParallel(net, compression="bf16")  # or "fp16"; off by default
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

rank = dist.get_rank()
torch.manual_seed(rank)  # every rank trains on its own batches
for _ in range(5):
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()  # gradients averaged over ranks
    optimizer.step()

weights = [torch.empty_like(model.module.weight) for _ in range(dist.get_world_size())]
dist.all_gather(weights, model.module.weight.detach())
assert all(torch.equal(w, weights[0]) for w in weights), "ranks ended with different models"
dist.destroy_process_group()
print(f"rank {rank}: ok")
