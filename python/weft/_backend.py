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
    _keep_weft_groups_unwrapped()


def _keep_weft_groups_unwrapped() -> None:
    """Under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` torch wraps every backend in its
    ProcessGroupWrapper, which checks each collective's op, shapes and dtypes on a gloo group
    of its own and names two ranks that differ; it also wants sequence numbers that weft's
    backend does not keep, so that ``init_process_group("weft")`` would fail. DETAIL turns on
    weft's own checks (WEFT_DEBUG_CHECKS), which compare op, count, dtype, root, reduce op and
    sequence number on weft's connections and list every rank's call: weft's groups are left
    unwrapped, every other backend's wrapped as before."""
    from torch.distributed import distributed_c10d as c10d

    wrap = getattr(c10d, "_create_process_group_wrapper", None)
    if wrap is None or getattr(wrap, "weft_leaves_unwrapped", False):
        return

    def create_process_group_wrapper(wrapped_pg, *args, **kwargs):
        if wrapped_pg.name() == NAME:
            return wrapped_pg
        return wrap(wrapped_pg, *args, **kwargs)

    create_process_group_wrapper.weft_leaves_unwrapped = True
    c10d._create_process_group_wrapper = create_process_group_wrapper


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
