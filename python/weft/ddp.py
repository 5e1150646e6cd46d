"""``weft.DistributedDataParallel``: torch's DDP over weft, with optional gradient compression.

It is torch's ``DistributedDataParallel`` itself (a subclass): same constructor, ``no_sync``,
``find_unused_parameters``, ``static_graph`` and state dict keys. Two additions: it creates the
weft process group from the torchrun environment when none exists, and
``compression="bf16"|"fp16"`` registers a comm hook that reduces each gradient bucket in that
dtype (half the bytes on the wire) and writes the average back in the gradients' dtype.
"""

from typing import Optional

import torch
import torch.distributed as dist

COMPRESSION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def init_process_group_from_env() -> None:
    """Creates the default ``weft`` process group from RANK, WORLD_SIZE, MASTER_ADDR/PORT
    (as torchrun sets them) unless a default process group already exists."""
    if not dist.is_initialized():
        dist.init_process_group(backend="weft", init_method="env://")


class CompressionState:
    """What the compression hook needs: the group to reduce over, the wire dtype, and one
    wire-dtype buffer per bucket, reused every step (a fresh tensor each step costs page
    faults that take longer than the cast itself)."""

    def __init__(self, group: dist.ProcessGroup, dtype: torch.dtype):
        self.group = group
        self.dtype = dtype
        self.wire_buffers: dict[int, torch.Tensor] = {}

    def wire_buffer(self, bucket: dist.GradBucket) -> torch.Tensor:
        wire = self.wire_buffers.get(bucket.index())
        if wire is None or wire.numel() != bucket.buffer().numel():  # buckets get rebuilt
            wire = torch.empty_like(bucket.buffer(), dtype=self.dtype)
            self.wire_buffers[bucket.index()] = wire
        return wire


def compressed_allreduce_hook(
    state: CompressionState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Averages ``bucket`` over ``state.group`` in ``state.dtype``, in place.

    (Annotations stay real objects, not strings: DDP checks them when the hook is registered.)"""
    buffer = bucket.buffer()
    wire = state.wire_buffer(bucket)
    # Divide before the cast: one rounding instead of two, and fp16 sums cannot overflow.
    wire.copy_(buffer.div_(state.group.size()))
    work = dist.all_reduce(wire, group=state.group, async_op=True)

    def decompress(future: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(future.value()[0])
        return buffer

    return work.get_future().then(decompress)


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """Drop-in for ``torch.nn.parallel.DistributedDataParallel``.

    Takes every argument torch's DDP takes, plus ``compression=None|"bf16"|"fp16"``.
    """

    def __init__(self, module: torch.nn.Module, *args, compression: Optional[str] = None, **kwargs):
        if compression is not None and compression not in COMPRESSION_DTYPES:
            raise ValueError(f"compression must be None, 'bf16' or 'fp16', not {compression!r}")
        init_process_group_from_env()
        super().__init__(module, *args, **kwargs)
        self.compression = compression
        if compression is not None:
            state = CompressionState(self.process_group, COMPRESSION_DTYPES[compression])
            self.register_comm_hook(state, compressed_allreduce_hook)
