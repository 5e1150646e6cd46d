"""torch.distributed over weft next to gloo, for the backend tests (see test_backend*.py).

On each pool rank (weft_pool.py) ``groups(ctx)`` initializes, once per process, the default
process group over weft and a gloo group over the same ranks; cases then run every operation on
both with the same inputs (``Twins``) and report where the results differ. Under
``weft_on("cuda")`` the weft side runs on CUDA copies of the inputs (test_gpu_backend.py).
"""

from __future__ import annotations

import contextlib
import traceback
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.torch_version import TorchVersion
from weft_pool import COMM_TIMEOUT_S

# Every dtype gloo reduces; integers and floats get small integer values, so that sums,
# products, minima and maxima of up to four ranks are exact in every one of them.
REDUCE_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
)
INTEGRAL = (torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool)
OPS = (
    dist.ReduceOp.SUM,
    dist.ReduceOp.PRODUCT,
    dist.ReduceOp.MIN,
    dist.ReduceOp.MAX,
    dist.ReduceOp.AVG,
    dist.ReduceOp.BAND,
    dist.ReduceOp.BOR,
    dist.ReduceOp.BXOR,
)
BITWISE = (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR)
# 0, 1, primes, and one above the one-shot allreduce threshold (the ring path).
COUNTS = (0, 1, 7, 1031, 65537)

# What the reference, gloo, lacks or does differently in older torch releases. The cases
# concerned compute their expected results without gloo there (see test_backend.py).
TORCH_VERSION = TorchVersion(torch.__version__)
# ReduceOp.AVG: from 2.8 (an allreduce by SUM, then an in-place division by the world size).
GLOO_HAS_AVG = TORCH_VERSION >= (2, 8)
# reduce_scatter, of lists or into a tensor, by the op given. Before 2.8 gloo has no list
# reduce_scatter; before 2.9 both forms sum whatever the op.
GLOO_REDUCE_SCATTERS = TORCH_VERSION >= (2, 9)
# Broadcast of complex tensors ("Invalid scalar type" before).
GLOO_BROADCASTS_COMPLEX = TORCH_VERSION >= (2, 9)
# A reduce_scatter_tensor whose output and input dtypes differ raises a RuntimeError; before,
# a failed CHECK aborts the process.
GLOO_RAISES_ON_MIXED_DTYPES = TORCH_VERSION >= (2, 10)
# all_to_all_single refuses a non-contiguous tensor (ValueError); torch 2.5's gloo takes it and
# sends its storage in memory order, not its elements in order.
GLOO_REFUSES_NON_CONTIGUOUS_ALL_TO_ALL = TORCH_VERSION >= (2, 6)
# gather of a non-contiguous input delivers its elements in order; before, gloo sends the
# input's storage in memory order, so that the root's tensor does not equal the input.
GLOO_GATHERS_NON_CONTIGUOUS = TORCH_VERSION >= (2, 9)


class Groups:
    """The default group (weft) and its gloo twin, over the same ranks."""

    def __init__(self, ctx):
        store = dist.PrefixStore("torch/", ctx.store)
        dist.init_process_group(
            "weft",
            store=store,
            rank=ctx.rank,
            world_size=ctx.size,
            timeout=timedelta(seconds=COMM_TIMEOUT_S),
        )
        self.weft = dist.group.WORLD
        self.gloo = dist.new_group(backend="gloo")


def groups(ctx) -> Groups:
    if not hasattr(ctx, "torch_groups"):
        import weft  # noqa: F401 - registers the backend

        ctx.torch_groups = Groups(ctx)
    return ctx.torch_groups


def values(shape, dtype, seed: int) -> torch.Tensor:
    """Deterministic small values in [-3, 3] (in [0, 3] for uint8, {0, 1} for bool)."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, shape, generator=gen).to(dtype)


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def reducible(op, dtype) -> bool:
    """Whether gloo accepts ``op`` on ``dtype`` (bitwise ops want integers)."""
    return op not in BITWISE or dtype in INTEGRAL


def flat_tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in flat_tensors(item)]
    return []


def moved(obj, device: str):
    """``obj`` with every tensor in it (in lists, tuples) copied to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(moved(item, device) for item in obj)
    return obj


class Twins:
    """Runs operations on the weft and gloo groups alike; collects the differences."""

    weft_device = "cpu"  # where the weft side's tensors live (see weft_on)

    def __init__(self, ctx):
        self.ctx = ctx
        self.groups = groups(ctx)
        self.lines: list[str] = []

    def same(
        self, what: str, make, run, *, approx=False, weft_may_accept=False, weft_refuses=False
    ):
        """``make()`` builds fresh arguments, ``run(group, *args)`` runs the op on them and
        returns what to compare (default: the arguments). Both backends must produce equal
        tensors (close ones when ``approx``) or raise the same kind of exception; weft may
        succeed where gloo refuses when ``weft_may_accept``; ``weft_refuses``: weft must raise
        a RuntimeError, whatever gloo does."""
        self.ctx.note(what)
        outcomes = []
        for group in (self.groups.weft, self.groups.gloo):
            on_gpu = group is self.groups.weft and self.weft_device != "cpu"
            args = moved(make(), self.weft_device) if on_gpu else make()
            try:
                result = run(group, *args)
                value = args if result is None else result
                outcomes.append(("ok", moved(value, "cpu") if on_gpu else value))
            except Exception as exc:  # noqa: BLE001 - compared between the backends
                outcomes.append(("raised", exc))
        (wk, wv), (gk, gv) = outcomes
        if weft_refuses:
            self.check(what, wk == "raised" and isinstance(wv, RuntimeError), f"weft: {wv!r}")
        elif wk == "raised" and gk == "raised":
            if not isinstance(wv, type(gv)) and not isinstance(gv, type(wv)):
                self.fail(what, f"weft raised {wv!r}, gloo raised {gv!r}")
        elif wk == "raised":
            trace = "".join(traceback.format_exception(type(wv), wv, wv.__traceback__))
            self.fail(what, f"weft raised, gloo did not:\n{trace}")
        elif gk == "raised":
            if not weft_may_accept:
                self.fail(what, f"gloo raised {gv!r}, weft did not")
        else:
            self.compare(what, wv, gv, approx)

    def expect(self, what: str, make, run, expected):
        """Like ``same`` for operations some gloo releases lack (torch 2.11's gloo has no list
        all_to_all): runs on the weft group alone and compares with ``expected``."""
        self.ctx.note(what)
        args = moved(make(), self.weft_device)
        try:
            result = run(self.groups.weft, *args)
        except Exception as exc:  # noqa: BLE001 - reported as a difference
            self.fail(what, f"weft raised {exc!r}")
            return
        self.compare(what, moved(args if result is None else result, "cpu"), expected)

    def refused(self, what: str, make, run, error=RuntimeError):
        """For operations whose reference some gloo releases cannot give (they abort the
        process, or accept what later ones refuse): runs on the weft group alone, which must
        raise ``error`` as later gloo does."""
        self.ctx.note(what)
        args = moved(make(), self.weft_device)
        try:
            run(self.groups.weft, *args)
        except error:
            return
        except Exception as exc:  # noqa: BLE001 - reported as a difference
            self.fail(what, f"weft raised {exc!r}, not {error.__name__}")
            return
        self.fail(what, f"weft did not raise {error.__name__}")

    def compare(self, what, got, want, approx=False):
        got_t, want_t = flat_tensors(got), flat_tensors(want)
        if len(got_t) != len(want_t):
            self.fail(what, f"{len(got_t)} tensors, gloo {len(want_t)}")
            return
        if not got_t and got != want:
            self.fail(what, f"weft {got!r}, gloo {want!r}")
        for i, (g, w) in enumerate(zip(got_t, want_t)):
            if g.dtype != w.dtype or g.shape != w.shape:
                self.fail(what, f"tensor {i}: {g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)}")
            elif approx and g.is_floating_point():
                if not torch.allclose(g.double(), w.double(), rtol=1e-2, atol=1e-2):
                    self.fail(what, f"tensor {i}: {describe(g)} vs gloo {describe(w)}")
            elif not torch.equal(g, w):
                self.fail(what, f"tensor {i}: {describe(g)} vs gloo {describe(w)}")

    def check(self, what: str, ok: bool, detail: str = ""):
        if not ok:
            self.fail(what, detail or "check failed")

    def fail(self, what: str, detail: str):
        self.lines.append(f"rank {self.ctx.rank}: {what}: {detail}")


@contextlib.contextmanager
def weft_on(device: str):
    """Within it, ``Twins`` give the weft group tensors on ``device`` (gloo keeps the CPU)."""
    previous, Twins.weft_device = Twins.weft_device, device
    try:
        yield
    finally:
        Twins.weft_device = previous


def describe(t: torch.Tensor) -> str:
    flat = t.reshape(-1)
    return f"{t.dtype}{list(t.shape)} {flat[:8].tolist()}{'...' if flat.numel() > 8 else ''}"


SHOWN = 40


def assert_same(per_rank: list) -> None:
    lines = [line for rank_lines in per_rank for line in rank_lines]
    shown = "\n".join(lines[:SHOWN])
    more = f"\n... and {len(lines) - SHOWN} more" if len(lines) > SHOWN else ""
    assert not lines, f"{len(lines)} differences between weft and gloo:\n{shown}{more}"
