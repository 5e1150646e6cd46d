"""Registers weft as the torch.distributed backend ``"weft"`` (CPU tensors).

``dist.init_process_group("weft")`` (or ``backend="cpu:weft"``) then creates one
weft communicator per process group, connected through the group's store.
"""

import torch.distributed as dist

NAME = "weft"


def _create_backend(dist_options, _backend_options):
    from weft import _C_torch

    return _C_torch.create_backend(
        dist_options.store,
        dist_options.group_rank,
        dist_options.group_size,
        dist_options.timeout.total_seconds(),
        str(dist_options.group_id),
    )


def register() -> None:
    """Makes ``"weft"`` known to torch.distributed; safe to call more than once."""
    if not dist.is_available() or NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(NAME, _create_backend, extended_api=True, devices=["cpu"])
