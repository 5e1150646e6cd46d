"""Soak: many mixed collectives on 4 ranks, checked against numpy, with the ranks' open file
descriptors, threads and RSS sampled as they go (docs/failures.md).

    python bench/soak.py [--ops 20000] [--ranks 4] [--transport shm] [--out bench/results/soak_ws4]

Every rank draws the same sequence from one seed: the collective (allreduce, broadcast,
allgather, reduce_scatter, reduce, alltoall), dtype, size (log-uniform up to 4 MiB per rank),
the group (the world or one of its subgroups, each its own communicator) and whether the call is
asynchronous (waited for after the next call on that group). Inputs are small integers from a
formula of (operation, rank, index), so any rank computes every reference exactly, in float16
too. A result counts as wrong if any element differs from the reference; results that every rank
of a group holds (allreduce, broadcast, allgather) are compared across ranks by checksum. fds,
threads and RSS are sampled every ``--every`` operations; the bound is on their growth after
the first 1000. Writes OUT.json, OUT.png and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np

OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "reduce", "alltoall")
DTYPES = ("float32", "float64", "float16", "int32", "int64", "int8")
REDUCE = ("sum", "max", "min")
MAX_BYTES = 4 << 20
WARM_OPS = 1000  # growth is measured from here
# Growth allowed after WARM_OPS: fds and threads none; RSS what the scratch cache and
# allocator arenas may still take on (the cache holds up to 256 MiB per process).
RSS_BOUND_MIB = 64


def groups_of(size: int) -> list[tuple[int, ...]]:
    """The world and a few subgroups (not powers of two among them)."""
    world = tuple(range(size))
    return [world, world[: size - 1], world[::2], world[1:]] if size > 2 else [world]


def draw(rng: np.random.Generator, size: int, groups) -> dict:
    g = int(rng.integers(len(groups)))
    n = len(groups[g])
    dtype = DTYPES[int(rng.integers(len(DTYPES)))]
    elem = np.dtype(dtype).itemsize
    count = int(np.exp(rng.uniform(0, np.log(MAX_BYTES // elem))))
    op = OPS[int(rng.integers(len(OPS)))]
    if op in ("reduce_scatter", "alltoall", "allgather"):
        count = max(0, count // n)
    return {
        "op": op,
        "dtype": dtype,
        "count": count,
        "group": g,
        "root": int(rng.integers(n)),
        "reduce": REDUCE[int(rng.integers(len(REDUCE)))],
        "async": bool(rng.integers(2)),
    }


def values(k: int, rank: int, count: int, dtype: str) -> np.ndarray:
    """Operation k's input on ``rank``: small integers in [-3, 3] (exact in every dtype)."""
    i = np.arange(count, dtype=np.int64)
    return (((i * 7 + rank * 13 + k * 5) % 7) - 3).astype(dtype)


def reference(call: dict, k: int, members, me: int):
    """What rank ``me`` (an index into members) must hold after operation k."""
    op, dtype, count, root = call["op"], call["dtype"], call["count"], call["root"]
    n = len(members)
    if op == "broadcast":
        return values(k, members[root], count, dtype)
    if op == "allgather":
        return np.concatenate([values(k, r, count, dtype) for r in members])
    if op == "alltoall":
        return np.concatenate(
            [values(k, r, count * n, dtype)[me * count : (me + 1) * count] for r in members]
        )
    per = count * n if op == "reduce_scatter" else count
    stack = np.stack([values(k, r, per, dtype).astype(np.int64) for r in members])
    reduced = {"sum": stack.sum(0), "max": stack.max(0), "min": stack.min(0)}[call["reduce"]]
    reduced = reduced.astype(dtype)
    if op == "reduce_scatter":
        return reduced[me * count : (me + 1) * count]
    return reduced


def start(comm, call: dict, k: int, members, me: int):
    """Issues operation k on ``comm``; returns (handle or None, the array to check)."""
    op, dtype, count, n = call["op"], call["dtype"], call["count"], len(members)
    rank = members[me]
    a = call["async"]
    if op == "allreduce":
        buf = values(k, rank, count, dtype)
        return comm.allreduce(buf, op=call["reduce"], async_=a), buf, buf
    if op == "broadcast":
        buf = values(k, rank, count, dtype) if me == call["root"] else np.zeros(count, dtype)
        return comm.broadcast(buf, root=call["root"], async_=a), buf, buf
    if op == "allgather":
        buf, out = values(k, rank, count, dtype), np.zeros(count * n, dtype)
        return comm.allgather(buf, out=out, async_=a), out, buf
    if op == "reduce_scatter":
        buf, out = values(k, rank, count * n, dtype), np.zeros(count, dtype)
        return comm.reduce_scatter(buf, op=call["reduce"], out=out, async_=a), out, buf
    if op == "reduce":
        buf, out = values(k, rank, count, dtype), np.zeros(count, dtype)
        h = comm.reduce(buf, root=call["root"], op=call["reduce"], out=out, async_=a)
        return h, (out if me == call["root"] else None), buf
    buf, out = values(k, rank, count * n, dtype), np.zeros(count * n, dtype)
    return comm.alltoall(buf, out, async_=a), out, buf


def sample() -> dict:
    rss_kib = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "rss_mib": rss_kib / 1024,
    }


def rank_main(rank, size, store, ops, seed, every, transport):
    """Runs the whole sequence on this rank: wrong elements, checksums and samples."""
    os.environ["WEFT_TRANSPORT"] = transport
    import weft

    groups = groups_of(size)
    comms = {}
    for g, members in enumerate(groups):
        # Subgroups get a prefix of their own on the shared store.
        if rank in members:
            comms[g] = weft.Communicator(
                store, members.index(rank), len(members), name=f"soak-{g}", timeout=120
            )
    rng = np.random.default_rng(seed)
    pending = {}  # group: (k, call, handle, out, keep-alive)
    wrong, checked, sums, samples = 0, 0, {}, []
    first_wrong = None

    def finish(k, call, handle, out, members, me):
        nonlocal wrong, checked, first_wrong
        if handle is not None and hasattr(handle, "wait"):
            handle.wait()
        if out is None:
            return
        expected = reference(call, k, members, me)
        bad = int(np.count_nonzero(out != expected))
        checked += out.size
        if bad and first_wrong is None:
            first_wrong = {"k": k, **call, "wrong": bad}
        wrong += bad
        if call["op"] in ("allreduce", "broadcast", "allgather"):
            sums[k] = zlib.crc32(out.tobytes())

    t0 = time.monotonic()
    for k in range(ops):
        call = draw(rng, size, groups)
        members = groups[call["group"]]
        if k % every == 0 or k == ops - 1:
            samples.append({"op": k, "seconds": time.monotonic() - t0, **sample()})
        if rank not in members:
            continue
        me = members.index(rank)
        comm = comms[call["group"]]
        handle, out, keep = start(comm, call, k, members, me)
        previous = pending.pop(call["group"], None)
        if previous:
            finish(*previous[:4], members, me)
        if call["async"]:
            pending[call["group"]] = (k, call, handle, out, keep)
        else:
            finish(k, call, None, out, members, me)
    for g, previous in pending.items():
        finish(*previous[:4], groups[g], groups[g].index(rank))
    samples.append({"op": ops, "seconds": time.monotonic() - t0, **sample()})
    return {
        "wrong": wrong,
        "checked": checked,
        "first_wrong": first_wrong,
        "sums": sums,
        "samples": samples,
    }


def summarize(results, ops: int) -> dict:
    """Wrong elements, checksum disagreements, and growth after WARM_OPS per rank."""
    disagree = 0
    for k in set().union(*(r["sums"] for r in results)):
        holders = {r["sums"][k] for r in results if k in r["sums"]}
        disagree += len(holders) > 1
    growth = []
    for rank, r in enumerate(results):
        after = [s for s in r["samples"] if s["op"] >= min(WARM_OPS, ops // 2)]
        base = after[0]
        growth.append(
            {
                "rank": rank,
                **{k: max(s[k] for s in after) - base[k] for k in ("fds", "threads", "rss_mib")},
            }
        )
    return {
        "wrong_elements": sum(r["wrong"] for r in results),
        "checked_elements": sum(r["checked"] for r in results),
        "first_wrong": next((r["first_wrong"] for r in results if r["first_wrong"]), None),
        "checksum_disagreements": disagree,
        "growth_after_warm": growth,
        "bounds": {"fds": 0, "threads": 0, "rss_mib": RSS_BOUND_MIB},
    }


def within_bounds(summary: dict) -> bool:
    b = summary["bounds"]
    return (
        summary["wrong_elements"] == 0
        and summary["checksum_disagreements"] == 0
        and all(all(g[k] <= b[k] for k in b) for g in summary["growth_after_warm"])
    )


def run(ops: int, size: int, transport: str, seed: int = 45, every: int = 250) -> tuple:
    import weft.local

    start_s = time.monotonic()
    results = weft.local.spawn(
        rank_main, size, ops, seed, every, transport, timeout=max(600, ops / 5)
    )
    return results, summarize(results, ops), time.monotonic() - start_s


def plot(results, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, label in zip(
        axes, ("fds", "threads", "rss_mib"), ("open fds", "threads", "RSS (MiB)"), strict=True
    ):
        for rank, r in enumerate(results):
            ax.plot(
                [s["op"] for s in r["samples"]], [s[key] for s in r["samples"]], label=f"r{rank}"
            )
        ax.axvline(WARM_OPS, color="grey", linestyle=":")
        ax.set_xlabel("operations issued")
        ax.set_title(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--transport", default="shm", choices=("shm", "tcp"))
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--out", default=None, help="write OUT.json, OUT.png and OUT.md")
    args = parser.parse_args()
    results, summary, seconds = run(args.ops, args.ranks, args.transport, args.seed)
    summary.update(
        ops=args.ops, ranks=args.ranks, transport=args.transport, seed=args.seed, seconds=seconds
    )
    print(json.dumps(summary, indent=1))
    if args.out:
        out = Path(args.out)
        samples = [r["samples"] for r in results]
        out.with_suffix(".json").write_text(json.dumps({**summary, "samples": samples}, indent=1))
        title = f"soak: {args.ops} mixed collectives, {args.ranks} ranks over {args.transport}"
        plot(results, out.with_suffix(".png"), title)
    return 0 if within_bounds(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
