"""Registers weft as the torch.distributed backend ``"weft"`` (CPU tensors, and CUDA tensors
when torch has CUDA).

``dist.init_process_group("weft")`` (or ``backend="cpu:weft"``) then creates one
weft communicator per process group, connected through the group's store.
"""

import os

import torch
import torch.distributed as dist

NAME = "weft"


def _create_backend(dist_options, _backend_options):
    from weft import _C_torch

    # torchrun restarts a group on the same store: each attempt's communicators get names of
    # their own, so that no rank reads an address (or secret) the previous attempt published.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    name = str(dist_options.group_id) + (f"/attempt{attempt}" if attempt else "")
    backend = _C_torch.create_backend(
        dist_options.store,
        dist_options.group_rank,
        dist_options.group_size,
        dist_options.timeout.total_seconds(),
        name,
    )
    spec = os.environ.get("WEFT_ALGO", "")
    if spec.startswith("file:"):
        from weft.topo.file_algo import install

        install(backend, spec, dist_options.group_rank, dist_options.group_size)
    return backend


def register() -> None:
    """Makes ``"weft"`` known to torch.distributed; safe to call more than once."""
    if not dist.is_available() or NAME in dist.Backend.backend_list:
        return
    devices = ["cpu", "cuda"] if torch.version.cuda else ["cpu"]
    dist.Backend.register_backend(NAME, _create_backend, extended_api=True, devices=devices)


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier`` for weft groups (torch's own accepts only gloo).

    Rank 0 waits up to ``timeout`` (default: the group's timeout) for every other rank and
    raises naming the first one that did not arrive, or all of them with ``wait_all_ranks``.
    """
    from torch.distributed import distributed_c10d as c10d

    if c10d._rank_not_in_group(group):
        return
    group = group or c10d._get_default_group()
    group.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
