"""weft's CUDA reduction kernels (weft.cuda.reduce) against a numpy reference on the CPU.

The reference replays the kernels' contract (csrc/core/reduce/cuda_reduce.h) exactly: a left
fold over the inputs in the storage type (float16/bfloat16 widened to float32 and rounded once
at the end), integer wrap-around, truncating integer avg, and Min/Max that do not depend on the
operands' order (NaN if either is NaN, -0 below +0). So every result is compared bit for bit,
except that any NaN matches any NaN.

Buffers are raw device bytes (uint8 torch tensors) placed at chosen byte offsets, so that the
vectorized body, the element-wise head and tail, and the byte-wise path for misaligned buffers
are all exercised. The tests marked ``gpu`` need a CUDA device (and torch with CUDA); the others
check the errors given without one.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import weft
import weft.cuda

DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64")
# (op, divisor): avg with a divisor divides, without one it sums.
OPS = (("sum", 0), ("prod", 0), ("min", 0), ("max", 0), ("avg", 0), ("avg", 3))
INPUTS = (1, 2, 3, 8, weft.cuda.MAX_INPUTS)
COUNTS = (0, 1, 7, 1000, 2**20 + 3)
# Byte offsets of the buffers from a 256-byte boundary: all aligned, all sharing one element
# offset (vector body after a scalar head), mixed element offsets (element-wise), a byte offset
# that breaks element alignment (byte-wise). "in-place" writes into the last input.
LAYOUTS = ("aligned", "same-offset", "mixed", "misaligned", "in-place")


def _no_gpu_reason() -> str | None:
    if not weft.cuda.is_built():
        return "no CUDA device: weft was built without CUDA"
    try:
        import torch
    except ImportError:
        return "no CUDA device: torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device: torch.cuda.is_available() is False"
    return None


gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(_no_gpu_reason() is not None, reason=str(_no_gpu_reason()))

# Storage dtype of each weft dtype, as numpy holds the bytes (bfloat16: its uint16 bits).
STORAGE = {d: np.dtype(d) for d in DTYPES if d != "bfloat16"} | {"bfloat16": np.dtype(np.uint16)}


def widen(dtype: str, x: np.ndarray) -> np.ndarray:
    """The compute form: float32 for the 16-bit floats, the storage type otherwise."""
    if dtype == "float16":
        return x.astype(np.float32)
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return x


def narrow(dtype: str, x: np.ndarray) -> np.ndarray:
    """Back to storage, rounding to nearest even (float32 -> bfloat16 through torch)."""
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return x


def truncating_divide(x: np.ndarray, divisor: int) -> np.ndarray:
    wide = x.astype(np.int64)
    q = wide // divisor
    q += ((wide % divisor) != 0) & (wide < 0)
    return q.astype(x.dtype)


def min_or_max(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The kernels' Min/Max: the smaller (larger) of a and b; NaN if either is; of -0 and +0,
    -0 for min and +0 for max."""
    out = np.where(a < b, a, b) if op == "min" else np.where(a > b, a, b)
    if a.dtype.kind == "f":
        tie = np.where(np.signbit(a) == (op == "min"), a, b)
        out = np.where(a == b, tie, out)
        out = np.where(np.isnan(a) | np.isnan(b), a + b, out)
    return out


def reference(dtype: str, op: str, divisor: int, inputs: list[np.ndarray]) -> np.ndarray:
    with np.errstate(all="ignore"):
        acc = widen(dtype, inputs[0]).copy()
        for x in inputs[1:]:
            x = widen(dtype, x)
            if op in ("sum", "avg"):
                acc = acc + x
            elif op == "prod":
                acc = acc * x
            else:
                acc = min_or_max(op, acc, x)
        if op == "avg" and divisor > 0:
            if acc.dtype.kind in "iu":
                acc = truncating_divide(acc, divisor)
            else:
                acc = acc / acc.dtype.type(divisor)
        return narrow(dtype, acc)


def random_inputs(dtype: str, op: str, n: int, count: int, rng) -> list[np.ndarray]:
    """Values that reach every rule: the whole integer range (wrap-around), floats of every
    sign with some NaN, Inf and signed zeros (Min/Max rules, NaN propagation)."""
    storage = STORAGE[dtype]
    if storage.kind in "iu":
        info = np.iinfo(storage)
        return [
            rng.integers(info.min, info.max, count, endpoint=True, dtype=storage) for _ in range(n)
        ]
    out = []
    for _ in range(n):
        x = (rng.standard_normal(count) * (2.0 if op == "prod" else 100.0)).astype(np.float32)
        special = rng.random(count)
        x[special < 0.02] = np.nan
        x[(special >= 0.02) & (special < 0.03)] = np.inf
        x[(special >= 0.03) & (special < 0.04)] = -0.0
        x[(special >= 0.04) & (special < 0.05)] = 0.0
        if dtype == "float64":
            out.append(x.astype(np.float64))
        else:
            out.append(narrow(dtype, x) if dtype == "bfloat16" else x.astype(storage))
    return out


def mismatch(dtype: str, got: np.ndarray, want: np.ndarray) -> str | None:
    """None when equal bit for bit (any NaN matching any NaN)."""
    same = got == want
    if dtype.startswith(("float", "bfloat")):
        same = (got.view(f"u{got.itemsize}") == want.view(f"u{want.itemsize}")) | (
            np.isnan(widen(dtype, got)) & np.isnan(widen(dtype, want))
        )
    bad = np.flatnonzero(~same)
    if bad.size == 0:
        return None
    shown = ", ".join(
        f"[{i}] want {widen(dtype, want[i : i + 1])[0]!r} got {widen(dtype, got[i : i + 1])[0]!r}"
        for i in bad[:3]
    )
    return f"{bad.size} of {got.size} elements differ: {shown}"


GUARD = 0xA5  # fills the bytes around every output, which must stay untouched
SLACK = 64


class DeviceBytes:
    """``nbytes`` of device memory at byte offset ``offset`` inside a guarded allocation."""

    def __init__(self, nbytes: int, offset: int, data: np.ndarray | None = None):
        import torch

        self.nbytes, self.offset = nbytes, offset
        self.tensor = torch.full((nbytes + SLACK,), GUARD, dtype=torch.uint8, device="cuda")
        if data is not None and nbytes:
            host = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8))
            self.tensor[offset : offset + nbytes].copy_(host)
        self.ptr = self.tensor.data_ptr() + offset

    def read(self, storage: np.dtype) -> tuple[np.ndarray, bool]:
        """The bytes as ``storage`` elements, and whether the guard bytes around are intact."""
        raw = self.tensor.cpu().numpy()
        body = raw[self.offset : self.offset + self.nbytes].copy().view(storage)
        outside = np.concatenate([raw[: self.offset], raw[self.offset + self.nbytes :]])
        return body, bool((outside == GUARD).all())


def layout_offsets(layout: str, buffers: int, elem: int) -> list[int]:
    if layout == "same-offset":
        return [elem] * buffers
    if layout == "mixed":
        return [(j % 4) * elem for j in range(buffers)]
    if layout == "misaligned":  # byte-wise for elements wider than a byte
        return [1 + j for j in range(buffers)]
    return [0] * buffers


def run_case(dtype: str, op: str, divisor: int, inputs: list[np.ndarray], layout: str):
    """Runs one reduction on the device; returns [(name, result, guard intact)]."""
    import torch

    storage = STORAGE[dtype]
    n, count = len(inputs), inputs[0].size
    nbytes = count * storage.itemsize
    offsets = layout_offsets(layout, n + 2, storage.itemsize)
    srcs = [DeviceBytes(nbytes, off, x) for x, off in zip(inputs, offsets)]
    dst = srcs[-1] if layout == "in-place" else DeviceBytes(nbytes, offsets[n])
    dst2 = DeviceBytes(nbytes, offsets[n + 1]) if layout in ("aligned", "misaligned") else None
    weft.cuda.reduce(
        dst.ptr,
        [s.ptr for s in srcs],
        count,
        dtype,
        op,
        divisor=divisor,
        dst2=dst2.ptr if dst2 else 0,
        device=torch.cuda.current_device(),
        stream=torch.cuda.current_stream().cuda_stream,
    )
    torch.cuda.synchronize()
    outputs = [("dst", dst)] + ([("dst2", dst2)] if dst2 else [])
    return [(name, *buf.read(storage)) for name, buf in outputs]


@gpu
@needs_gpu
@pytest.mark.parametrize(("op", "divisor"), OPS, ids=[f"{o}{d or ''}" for o, d in OPS])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_matches_reference(dtype, op, divisor):
    rng = np.random.default_rng(zlib.crc32(f"{dtype}/{op}/{divisor}".encode()))
    failures = []
    for count in COUNTS:
        inputs = INPUTS if count <= 1000 else (2, 3)
        pool = random_inputs(dtype, op, max(inputs), count, rng)
        for n in inputs:
            want = reference(dtype, op, divisor, pool[:n])
            for layout in LAYOUTS:
                for name, got, guard_ok in run_case(dtype, op, divisor, pool[:n], layout):
                    where = f"{dtype} {op} divisor={divisor} n={n} count={count} {layout} {name}"
                    problem = mismatch(dtype, got, want)
                    if problem:
                        failures.append(f"{where}: {problem}")
                    if not guard_ok:
                        failures.append(f"{where}: wrote outside its buffer")
    assert not failures, "\n".join(failures[:20])


@gpu
@needs_gpu
def test_reduce_is_ordered_on_the_given_stream_and_does_not_wait():
    import torch

    count = 1 << 22
    a = torch.empty(count, device="cuda")
    b = torch.empty(count, device="cuda")
    out = torch.empty(count, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # holds the stream: the fills and the reduce wait
        a.fill_(1.5)
        b.fill_(2.0)
        weft.cuda.reduce(
            out.data_ptr(),
            [a.data_ptr(), b.data_ptr()],
            count,
            "float32",
            "max",
            device=out.device.index,
            stream=side.cuda_stream,
        )
        assert not side.query(), "reduce waited for the stream"
        total = out.sum()
    side.synchronize()
    assert total.item() == 2.0 * count


@gpu
@needs_gpu
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"srcs": []}, "0 inputs"),
        ({"srcs": [1] * (weft.cuda.MAX_INPUTS + 1)}, "inputs"),
        ({"device": -1}, "out of range"),
        ({"device": 1 << 20}, "out of range"),
        ({"dst": 0}, "null buffer"),
        ({"dtype": "complex64"}, "unsupported dtype"),
        ({"op": "band"}, "unsupported reduce op"),
    ],
)
def test_invalid_arguments_are_refused(change, message):
    import torch

    buf = torch.zeros(16, device="cuda")
    call = {
        "dst": buf.data_ptr(),
        "srcs": [buf.data_ptr(), buf.data_ptr()],
        "count": 16,
        "dtype": "float32",
        "op": "sum",
        "device": buf.device.index,
    } | change
    with pytest.raises(weft.InvalidArgument, match=message):
        weft.cuda.reduce(
            call.pop("dst"), call.pop("srcs"), call.pop("count"), call.pop("dtype"), **call
        )


# ---- without a GPU: the errors say why ---------------------------------------------------------


@pytest.mark.skipif(weft.cuda.is_built(), reason="weft was built with CUDA")
def test_without_cuda_every_call_says_weft_was_built_without_it():
    assert weft.cuda.MAX_INPUTS == 0
    for call in (weft.cuda.device_count, lambda: weft.cuda.reduce(0, [0, 0], 1, "float32")):
        with pytest.raises(weft.Error, match="weft was built without CUDA"):
            call()


@pytest.mark.skipif(not weft.cuda.is_built(), reason="weft was built without CUDA")
def test_without_a_device_every_call_says_there_is_none():
    try:
        weft.cuda.device_count()
    except weft.Error as e:
        assert str(e).startswith("no CUDA device"), str(e)
    else:
        pytest.skip("a CUDA device is present")
    with pytest.raises(weft.Error, match="^no CUDA device"):
        weft.cuda.reduce(1 << 20, [1 << 20, 1 << 20], 1, "float32")
