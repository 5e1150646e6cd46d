"""Deterministic per-rank inputs, numpy references and result checks for the weft tests.

Inputs are windows into a pseudo-random table of PERIOD (a prime) values, shifted per rank:
element i of rank r's input is table[(shift(r) + i) % PERIOD]. Any rank can build any other
rank's input, or a slice of it, cheaply and without communication, and references need only
be computed over one period. Values are chosen so that every reference is exact:

- integers: the full range of the type for sum/prod/min/max (numpy's wrapping arithmetic is
  the reference), small values for avg (truncating division of the sum);
- floats: small integers for sum/avg ([-3, 3]), [-100, 100] for min/max, {+-0.5, +-1, +-2}
  for prod, so sums and products of up to 5 ranks are exact in float16 and bfloat16 too;
- data-movement ops ("bits"): arbitrary values, compared bit for bit.

A dtype is named "np.<dtype>" (numpy array) or "torch.<dtype>" (CPU torch tensor).
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

NUMPY_DTYPES = ("float32", "float64", "float16", "int8", "uint8", "int32", "int64")
DTYPES = tuple(f"np.{d}" for d in NUMPY_DTYPES) + ("torch.bfloat16", "torch.float32")
OPS = ("sum", "prod", "min", "max", "avg")
COUNTS = (0, 1, 7, 1000, 2**20 + 3)

PERIOD = 65521  # a prime: no chunk, slot or world size divides it
_M64 = (1 << 64) - 1
_TOLERANCE = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-12}


def split(dtype: str) -> tuple[str, str]:
    """Splits "np.float32" into ("np", "float32")."""
    kind, _, name = dtype.partition(".")
    return kind, name


def ref_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that holds the values of ``dtype`` exactly."""
    name = split(dtype)[1]
    return np.dtype("float32" if name == "bfloat16" else name)


def is_int(dtype: str) -> bool:
    return ref_dtype(dtype).kind in "iu"


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _hash(salt: str, n: int) -> np.ndarray:
    seed = (zlib.crc32(salt.encode()) * 0x9E3779B97F4A7C15) & _M64
    idx = np.arange(n, dtype=np.uint64)
    return _mix(idx * np.uint64(0xD1B54A32D192ED03) + np.uint64(seed))


def _small(h: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return (h % np.uint64(hi - lo + 1)).astype(np.int64) + lo


def input_kind(op: str | None, dtype: str) -> str:
    """Which family of values an op is tested with (op None: a data-movement op)."""
    if op is None:
        return "bits"
    if is_int(dtype):
        return "small" if op == "avg" else "full"
    return {"sum": "small", "avg": "small", "min": "minmax", "max": "minmax", "prod": "prod"}[op]


@functools.lru_cache(maxsize=128)
def _table(dtype: str, kind: str, salt: str) -> np.ndarray:
    """PERIOD pseudo-random values of one family, as ``ref_dtype(dtype)``."""
    rdt = ref_dtype(dtype)
    h = _hash(f"{salt}/{dtype}/{kind}", PERIOD)
    if rdt.kind in "iu":
        if kind == "small":
            lo, hi = (0, 6) if rdt.kind == "u" else (-3, 3)
            table = _small(h, lo, hi).astype(rdt)
        elif kind in ("full", "bits"):
            table = h.view(np.int64).astype(rdt)  # the whole range, wrapping
        else:
            raise ValueError(kind)
    elif kind == "small":
        table = _small(h, -3, 3).astype(rdt)
    elif kind == "minmax":
        table = _small(h, -100, 100).astype(rdt)
    elif kind == "prod":
        table = np.array([-2, -1, -0.5, 0.5, 1, 2], dtype=rdt)[(h % np.uint64(6)).astype(np.intp)]
    elif kind == "bits":
        table = ((h >> np.uint64(11)).astype(np.float64) / 2.0**53 * 2000.0 - 1000.0).astype(rdt)
        if split(dtype)[1] == "bfloat16":  # round to a bfloat16-representable float32
            table = (table.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    else:
        raise ValueError(kind)
    table.setflags(write=False)
    return table


def _window(table: np.ndarray, offset: int, n: int) -> np.ndarray:
    """``table[(offset + i) % PERIOD] for i in range(n)``, built by copying, not indexing."""
    return np.resize(np.roll(table, -(offset % PERIOD)), n)


def _shift(rank: int) -> int:
    return (rank * 7919 + 101) % PERIOD


def values(dtype: str, kind: str, rank: int, start: int, stop: int, salt: str = "") -> np.ndarray:
    """Elements [start, stop) of ``rank``'s input, as a numpy array of ``ref_dtype(dtype)``."""
    return _window(_table(dtype, kind, salt), _shift(rank) + start, stop - start)


def stacked(dtype: str, kind: str, size: int, start: int, stop: int, salt: str = ""):
    """Every rank's slice [start, stop), shape (size, stop - start)."""
    return np.stack([values(dtype, kind, r, start, stop, salt) for r in range(size)])


@functools.lru_cache(maxsize=128)
def _reduced_table(dtype: str, kind: str, size: int, op: str, salt: str) -> np.ndarray:
    return reduce_ref(stacked(dtype, kind, size, 0, PERIOD, salt), op)


def reduced(dtype: str, kind: str, size: int, op: str, start: int, stop: int, salt: str = ""):
    """Elements [start, stop) of the reduction over all ranks' inputs (see reduce_ref).

    Input element i of rank r is table[(shift(r) + i) % PERIOD], so the reduction is
    periodic too: it is computed on one period and repeated."""
    return _window(_reduced_table(dtype, kind, size, op, salt), start, stop - start)


def reduce_ref(stack: np.ndarray, op: str) -> np.ndarray:
    """The reduction of the rows of ``stack``: wrapping for integers, float64 for floats."""
    size = stack.shape[0]
    if stack.dtype.kind in "iu":
        dt = stack.dtype
        if op == "sum":
            return stack.sum(axis=0, dtype=dt)
        if op == "prod":
            return stack.prod(axis=0, dtype=dt)
        if op == "avg":
            total = stack.astype(np.int64).sum(axis=0)
            return (np.sign(total) * (np.abs(total) // size)).astype(dt)  # truncating
    else:
        stack = stack.astype(np.float64)
        if op == "sum":
            return stack.sum(axis=0)
        if op == "prod":
            return stack.prod(axis=0)
        if op == "avg":
            return stack.sum(axis=0) / size
    if op == "min":
        return stack.min(axis=0)
    if op == "max":
        return stack.max(axis=0)
    raise ValueError(op)


# ---- buffers ---------------------------------------------------------------------------------


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def make_buffer(dtype: str, data: np.ndarray):
    """A fresh writable buffer of ``dtype`` holding ``data``."""
    kind, name = split(dtype)
    if kind == "np":
        return np.array(data, dtype=name, copy=True)
    import torch

    return torch.from_numpy(np.array(data, dtype=np.float32 if name == "bfloat16" else name)).to(
        _torch_dtype(name)
    )


def sentinel_buffer(dtype: str, count: int):
    """A fresh buffer of ``count`` elements filled with a value no op produces by accident."""
    fill = 123 if is_int(dtype) else np.nan
    return make_buffer(dtype, np.full(count, fill, dtype=ref_dtype(dtype)))


def to_numpy(buf) -> np.ndarray:
    """A numpy copy of a buffer (bfloat16 widened exactly to float32)."""
    if isinstance(buf, np.ndarray):
        return buf.copy()
    import torch

    if buf.dtype == torch.bfloat16:
        buf = buf.float()
    return buf.detach().numpy().copy()


def describe_buffer(buf) -> str:
    if isinstance(buf, np.ndarray):
        return f"numpy {buf.dtype}[{buf.size}]"
    return f"torch {str(buf.dtype).removeprefix('torch.')}[{buf.numel()}]"


def same_kind(buf, dtype: str, count: int) -> bool:
    """Is ``buf`` a numpy array / torch tensor (as ``dtype`` says) of that dtype and length?"""
    kind, name = split(dtype)
    if kind == "np":
        return isinstance(buf, np.ndarray) and buf.dtype == np.dtype(name) and buf.size == count
    import torch

    if not isinstance(buf, torch.Tensor):
        return False
    return buf.dtype == _torch_dtype(name) and buf.numel() == count


# ---- checks ----------------------------------------------------------------------------------


def compare(got, expected: np.ndarray, dtype: str, op: str | None) -> str | None:
    """None if ``got`` matches; otherwise a short description of the first differences.

    Exact for integers, data movement and float sum/min/max; relative tolerance for float
    prod and avg."""
    got = to_numpy(got).reshape(-1)
    if got.size != expected.size:
        return f"has {got.size} elements, expected {expected.size}"
    if is_int(dtype) or op is None:
        ok = got == expected.astype(got.dtype)
    else:
        got = got.astype(np.float64)
        exp = expected.astype(np.float64)
        if op in ("prod", "avg"):
            tol = _TOLERANCE[split(dtype)[1]]
            ok = np.isclose(got, exp, rtol=tol, atol=tol)
        else:
            ok = got == exp
    bad = np.flatnonzero(~ok)
    if bad.size == 0:
        return None
    shown = ", ".join(f"[{i}] expected {expected[i]!r} got {got[i]!r}" for i in bad[:3])
    return f"{bad.size} of {got.size} elements differ: {shown}"


def is_invalid_argument(exc: BaseException) -> bool:
    """Is ``exc`` a weft.InvalidArgument? (By name too, in case weft does not export it.)"""
    import weft

    cls = getattr(weft, "InvalidArgument", None)
    if cls is not None:
        return isinstance(exc, cls)
    return any(c.__name__ == "InvalidArgument" for c in type(exc).__mro__)


class CaseFailed(Exception):
    """Raised in a worker when a case raised something that may have broken the communicator."""


class Checker:
    """Collects mismatches of one rank as readable lines.

    ``with checker.case(desc):`` runs one case: an InvalidArgument (raised before any byte
    moves, so every rank is still in step) is recorded and the loop goes on; anything else
    is recorded and stops the rank with CaseFailed, listing everything found so far.
    """

    def __init__(self, rank: int, note=None):
        self.rank = rank
        self.lines: list[str] = []
        self._note = note
        self._desc = ""

    def case(self, desc: str):
        self._desc = desc
        if self._note is not None:
            self._note(desc)
        return self

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            return False
        self.fail(f"raised {exc_type.__name__}: {exc}")
        if is_invalid_argument(exc):
            return True
        raise CaseFailed("\n".join(self.lines)) from exc

    def fail(self, what: str) -> None:
        self.lines.append(f"{self._desc}: rank {self.rank}: {what}")

    def check(self, got, expected, dtype: str, op: str | None = None, what: str = "") -> None:
        problem = compare(got, expected, dtype, op)
        if problem:
            self.fail(f"{what + ': ' if what else ''}{problem}")

    def check_returned(self, returned, expected_obj, name: str) -> None:
        if returned is not expected_obj:
            self.fail(f"returned {type(returned).__name__} object, not `{name}` itself")


def assert_no_mismatch(per_rank: list[list[str]], limit: int = 60) -> None:
    """Fails with every rank's mismatch lines (up to ``limit``)."""
    lines = [line for rank_lines in per_rank for line in rank_lines]
    if lines:
        shown = "\n".join(lines[:limit])
        more = f"\n... and {len(lines) - limit} more" if len(lines) > limit else ""
        raise AssertionError(f"{len(lines)} mismatches:\n{shown}{more}")
