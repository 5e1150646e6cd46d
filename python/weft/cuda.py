"""weft's CUDA reduction kernels on raw device pointers (the integers ``tensor.data_ptr()`` and
``torch.cuda.Stream.cuda_stream`` give). They exist when weft was built with nvcc on the PATH;
otherwise every call raises ``weft.Error`` saying so.

``reduce(dst, srcs, count, dtype, op)`` enqueues ``dst = srcs[0] op srcs[1] op ...`` (1 to
``MAX_INPUTS`` inputs) on a stream and returns without waiting. Semantics are those of the CPU
kernels (``csrc/core/reduce/cuda_reduce.h`` lists the few differences).
"""

from __future__ import annotations

from weft import _C

_kernels = getattr(_C, "cuda", None)

MAX_INPUTS = _kernels.MAX_INPUTS if _kernels else 0


def is_built() -> bool:
    """True when weft was built with its CUDA kernels (it says nothing about a GPU being here)."""
    return _kernels is not None


def _require():
    if _kernels is None:
        raise _C.Error(
            "weft was built without CUDA (nvcc was not found, or WEFT_CUDA=OFF): rebuild it "
            "with nvcc on the PATH or CUDACXX set"
        )
    return _kernels


def nccl_version() -> str | None:
    """The version of the NCCL library weft's nccl transport uses (``"2.21.5"``: the one loaded,
    which may be torch's), or None when weft was built without NCCL (or without CUDA). Needs no
    GPU."""
    if _kernels is None:
        return None
    return _kernels.nccl_version() or None


def device_count() -> int:
    """The number of CUDA devices; raises ``weft.Error`` when there is none or no driver."""
    return _require().device_count()


def reduce(
    dst: int,
    srcs: list[int],
    count: int,
    dtype: str,
    op: str = "sum",
    *,
    divisor: int = 0,
    dst2: int = 0,
    device: int = 0,
    stream: int = 0,
) -> None:
    """Enqueues the element-wise reduction of ``count`` elements of every pointer in ``srcs``
    into ``dst`` (and ``dst2`` when not 0) on ``stream`` (0: the legacy default stream) of
    ``device``. ``dtype`` is a weft dtype name ("float32", "bfloat16", ...), ``op`` one of sum,
    prod, min, max, avg; avg divides by ``divisor`` when it is positive. ``dst`` may be one of
    ``srcs``."""
    _require().reduce(
        dst, srcs, count, dtype, op, divisor=divisor, dst2=dst2, device=device, stream=stream
    )
