"""Trains a small classifier on scikit-learn's digits data set with weft.DistributedDataParallel.

    torchrun --nproc-per-node 2 examples/train_digits.py                 # over weft
    torchrun --nproc-per-node 2 examples/train_digits.py --backend gloo  # the same run over gloo

Every rank trains on its half of each epoch's shuffled training set; with the same seed, both
runs see the same batches and print the same losses. Rank 0 reports the test accuracy and
whether every rank ended with the same parameters; ``--json`` makes every rank print its
per-step losses and results as one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json

import torch
import torch.distributed as dist
import weft
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="weft", help="process group backend (weft, gloo)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON line per rank")
    return parser.parse_args()


def digits_datasets(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """The 1797 8x8 digit images, pixels scaled to [0, 1], split 75/25 (stratified)."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.25, random_state=seed, stratify=digits.target
    )

    def dataset(x, y):
        return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y))

    return dataset(x_train, y_train), dataset(x_test, y_test)


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def accuracy(model: torch.nn.Module, data: TensorDataset) -> float:
    x, y = data.tensors
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def parameters_identical_across_ranks(model: torch.nn.Module) -> bool:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.numpy().tobytes())
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest.hexdigest())
    return len(set(digests)) == 1


def main() -> None:
    args = parse_args()
    if args.backend != "weft":
        dist.init_process_group(args.backend)  # otherwise weft's DDP creates a weft group
    torch.manual_seed(args.seed)
    model = weft.DistributedDataParallel(make_model())
    rank = dist.get_rank()
    train, test = digits_datasets(args.seed)
    sampler = DistributedSampler(train, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        if rank == 0 and not args.json:
            steps = len(loader)
            mean_loss = sum(losses[-steps:]) / steps
            test_accuracy = accuracy(model, test)
            print(f"epoch {epoch + 1:3d}  loss {mean_loss:.4f}  test accuracy {test_accuracy:.4f}")
    result = {
        "rank": rank,
        "backend": dist.get_backend(),
        "losses": losses,
        "test_accuracy": accuracy(model, test),
        "parameters_identical": parameters_identical_across_ranks(model),
    }
    if args.json:
        print(json.dumps(result), flush=True)
    elif rank == 0:
        print(
            f"test accuracy {result['test_accuracy']:.4f}; parameters identical on all "
            f"{dist.get_world_size()} ranks: {result['parameters_identical']}"
        )
    # DDP's hooks tie the model, and through its reducer the process group, into reference
    # cycles. Collected at interpreter exit instead, gloo's group aborts the process now and then
    # ("terminate called without an active exception").
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
