"""Horovod-style helpers: make every rank start from the root's model and optimizer.

``broadcast_parameters(module, root=0)`` and ``broadcast_optimizer_state(optimizer, root=0)``
work over the default process group (or ``group=``), whatever its backend; ``root`` is a global
rank, like torch's ``src``. Tensors travel in one flat buffer per dtype, so a model costs a few
broadcasts, not one per tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist


def broadcast_tensors(tensors: list[torch.Tensor], root: int = 0, group=None) -> None:
    """Overwrites every tensor with the root's, in place (one broadcast per device type and
    dtype: an optimizer's state mixes CPU scalars with GPU tensors)."""
    by_kind: dict[tuple[str, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        by_kind.setdefault((tensor.device.type, tensor.dtype), []).append(tensor)
    with torch.no_grad():
        for same_kind in by_kind.values():
            flat = torch.cat([t.detach().reshape(-1) for t in same_kind])
            dist.broadcast(flat, src=root, group=group)
            offset = 0
            for tensor in same_kind:
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()


def broadcast_parameters(params, root: int = 0, group=None) -> None:
    """Gives every rank the root's parameters and buffers, in place.

    ``params``: a module (its ``state_dict()``), a state dict, or ``named_parameters()``-style
    (name, tensor) pairs, as Horovod's ``broadcast_parameters`` takes.
    """
    if isinstance(params, torch.nn.Module):
        params = params.state_dict()
    if isinstance(params, Mapping):
        params = params.items()
    broadcast_tensors([tensor for _, tensor in params], root, group)


@dataclass(frozen=True)
class _TensorSlot:
    """Stands for one tensor of an optimizer state dict while the dict's structure travels."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device


def _map_leaves(value, leaf_type: type, fn):
    """``value`` (nested dicts, lists and tuples) with every ``leaf_type`` leaf replaced by
    ``fn(leaf)``; leaves are visited in the same order on every rank."""
    if isinstance(value, leaf_type):
        return fn(value)
    if isinstance(value, Mapping):
        return {key: _map_leaves(item, leaf_type, fn) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_leaves(item, leaf_type, fn) for item in value)
    return value


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root: int = 0, group=None):
    """Gives every rank the root's optimizer state and hyperparameters (lr, betas, ...).

    The state dict's structure travels as one pickled object, its tensors as flat buffers.
    """
    tensors: list[torch.Tensor] = []

    def to_slot(tensor: torch.Tensor) -> _TensorSlot:
        tensors.append(tensor)
        return _TensorSlot(tuple(tensor.shape), tensor.dtype, tensor.device)

    def from_slot(slot: _TensorSlot) -> torch.Tensor:
        # The root's GPU tensors land on this rank's own GPU, not on the root's device index.
        device = slot.device
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        tensors.append(torch.empty(slot.shape, dtype=slot.dtype, device=device))
        return tensors[-1]

    is_root = dist.get_rank() == root
    message = [_map_leaves(optimizer.state_dict(), torch.Tensor, to_slot) if is_root else None]
    dist.broadcast_object_list(message, src=root, group=group)
    if not is_root:
        state = _map_leaves(message[0], _TensorSlot, from_slot)
    broadcast_tensors(tensors, root, group)
    if not is_root:
        optimizer.load_state_dict(state)
