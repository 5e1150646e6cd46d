"""Reads the flight recorder's files and says which rank went wrong.

Every rank of a communicator writes ``<name>.rank<R>.weft-trace`` into ``WEFT_TRACE_DIR`` when
one of its operations fails or when it gets SIGTERM or SIGABRT (docs/failures.md). ``python -m
weft.trace DIR`` reads every rank's file and prints a verdict: its first line names the rank
that died, is behind or called something different from the others, and in what; the lines
after it give each rank's last operation and its error.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SUFFIX = ".weft-trace"
# The verdict lists every rank of a world: a file claiming more is refused.
MOST_RANKS = 1 << 20
# Entries that are no call of the user's: communicator creation.
SETUP_OPS = {"create"}
WAITING_FOR = re.compile(r"waiting to [a-z ]+? rank (\d+)")
LOST = re.compile(r"lost rank (\d+)")
# The rank at the end of a chain of waits that had not timed out itself (comm.cc's blame_chain).
HUNG = re.compile(r"rank (\d+)(?: is hung or slow|, which sent nothing: it is hung or slow)")
ABORTED_PEER = " had aborted: "  # a survivor's error names why the peer it lost aborted


@dataclass
class Op:
    seq: int
    name: str
    dtype: str
    reduce: str
    count: int
    root: int
    algorithm: str
    peers: list[int]
    state: str
    start_us: int
    end_us: int

    def call(self) -> tuple:
        """What the caller asked for: the same on every rank of a correct program."""
        return (self.name, self.count, self.dtype, self.reduce, self.root)

    def describe(self) -> str:
        if self.name == "create":
            return "the communicator's creation"
        what = f"{self.name} #{self.seq} ({self.count} {self.dtype}"
        if self.name in ("allreduce", "reduce", "reduce_scatter"):
            what += f", {self.reduce}"
        if self.name in ("broadcast", "reduce", "gather", "scatter"):
            what += f", root {self.root}"
        return what + ")"


@dataclass
class RankTrace:
    comm: str
    rank: int
    size: int
    pid: int
    signal: str | None
    reason: str | None
    ops: list[Op] = field(default_factory=list)

    def calls(self) -> dict[int, Op]:
        """The user's operations by sequence number."""
        return {op.seq: op for op in self.ops if op.name not in SETUP_OPS}

    def last(self) -> Op | None:
        user = [op for op in self.ops if op.name not in SETUP_OPS]
        return user[-1] if user else (self.ops[-1] if self.ops else None)

    def own_error(self) -> str:
        """This rank's own error, without the cause it learned from a peer that aborted."""
        return (self.reason or "").split(ABORTED_PEER)[0]

    def timed_out(self) -> bool:
        """Whether this rank's error is a timeout, its own or one a peer aborted on."""
        return "nothing arrived for" in (self.reason or "")

    def hung_peer(self) -> int | None:
        """The rank this rank's error says had not timed out itself when this one did, at the end
        of its chain of waits (it may time out later, once it is continued)."""
        found = HUNG.findall(self.reason or "")
        return int(found[-1]) if found else None

    def waited_for(self) -> int | None:
        """The rank whose wait timed out last in the chain of causes."""
        found = WAITING_FOR.findall(self.reason or "") if self.timed_out() else []
        return int(found[-1]) if found else None


def parse(path: Path) -> RankTrace:
    """One rank's file; ValueError naming the file (and line) where it is not the recorder's."""
    header: dict[str, str] = {}
    ops = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        key, _, rest = line.partition(" ")
        if key != "op":
            header[key] = rest
            continue
        try:
            ops.append(_op(dict(item.split("=", 1) for item in rest.split() if "=" in item)))
        except (KeyError, ValueError) as e:
            raise ValueError(
                f"{path}, line {number}: not an operation of the recorder ({e})"
            ) from None
    if header.get("weft-trace") != "1":
        raise ValueError(f"{path}: not a weft flight-recorder file (version 1)")
    try:
        trace = RankTrace(
            comm=header["comm"],
            rank=int(header["rank"]),
            size=int(header["size"]),
            pid=int(header["pid"]),
            signal=header.get("signal"),
            reason=header.get("reason"),
            ops=ops,
        )
    except (KeyError, ValueError) as e:
        raise ValueError(f"{path}: the recorder's header is incomplete or wrong ({e})") from None
    if not 0 <= trace.rank < trace.size <= MOST_RANKS:
        raise ValueError(
            f"{path}: rank {trace.rank} of a world of {trace.size} (at most {MOST_RANKS} ranks)"
        )
    return trace


def _op(f: dict[str, str]) -> Op:
    peers = [] if f["peers"] == "-" else [int(p) for p in f["peers"].split(",")]
    return Op(
        seq=int(f["seq"]),
        name=f["name"],
        dtype=f["dtype"],
        reduce=f["reduce"],
        count=int(f["count"]),
        root=int(f["root"]),
        algorithm=f["algorithm"],
        peers=peers,
        state=f["state"],
        start_us=int(f["start_us"]),
        end_us=int(f["end_us"]),
    )


def read(directory: str | Path) -> dict[str, dict[int, RankTrace]]:
    """Every communicator's traces in ``directory``: {comm: {rank: trace}}."""
    comms: dict[str, dict[int, RankTrace]] = {}
    for path in sorted(Path(directory).glob("*" + SUFFIX)):
        trace = parse(path)
        comms.setdefault(trace.comm, {})[trace.rank] = trace
    return comms


def ranks(rs) -> str:
    rs = sorted(rs)
    word = "rank" if len(rs) == 1 else "ranks"
    if len(rs) <= 2:
        return f"{word} " + " and ".join(map(str, rs))
    return f"{word} " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"


def state(trace: RankTrace) -> str:
    last = trace.last()
    return f"{last.describe()}, {last.state}" if last else "no operation"


def where(traces: dict[int, RankTrace], rs) -> str:
    """Where the ranks ``rs`` stopped: their last operations, grouped."""
    by_op: dict[str, list[int]] = {}
    for r in rs:
        by_op.setdefault(state(traces[r]), []).append(r)
    return "; ".join(f"{ranks(group)} in {text}" for text, group in by_op.items())


def difference(a: Op, b: Op) -> str:
    """In what call ``a`` differs from ``b``."""
    names = ("op", "size", "dtype", "reduce op", "root")
    return ", ".join(n for n, x, y in zip(names, a.call(), b.call(), strict=True) if x != y)


def first_difference(traces: dict[int, RankTrace]) -> str | None:
    """The rank whose call differs from the others' at the first sequence number where calls
    differ: in op, size, dtype, reduce op, root, or order."""
    calls = {r: t.calls() for r, t in traces.items()}
    seqs = sorted({s for c in calls.values() for s in c})
    for seq in seqs:
        at = {r: c[seq] for r, c in calls.items() if seq in c}
        groups: dict[tuple, list[int]] = {}
        for r, op in at.items():
            groups.setdefault(op.call(), []).append(r)
        if len(groups) < 2:
            continue
        # The odd one out: the smallest group (ties: the one without the lowest rank).
        ordered = sorted(groups.values(), key=lambda g: (len(g), -min(g)))
        odd, rest = ordered[0], [r for g in ordered[1:] for r in g]
        mine, theirs = at[odd[0]], at[rest[0]]
        near = range(seq - 3, seq + 4)
        other_seqs = [s for s in near if s != seq]
        swapped = any(
            calls[odd[0]].get(s) and calls[odd[0]][s].call() == theirs.call() for s in other_seqs
        ) or any(calls[rest[0]].get(s) and calls[rest[0]][s].call() == mine.call() for s in near)
        what = "order" if swapped else difference(mine, theirs)
        return (
            f"{ranks(odd)} differs in {what} at operation #{seq}: it called "
            f"{mine.describe()} where {ranks(rest)} called {theirs.describe()}"
        )
    return None


def behind(traces: dict[int, RankTrace]) -> str | None:
    """A rank the others waited for: the one that timed-out ranks name and that had not timed
    out itself when they did (a stopped rank may even be ahead: its sends were buffered; once
    continued, it may time out in turn), else one whose last call came before the others'."""

    def suspect(t: RankTrace) -> int | None:
        hung, waited = t.hung_peer(), t.waited_for()
        if hung in traces:
            return hung
        if waited in traces and "nothing arrived for" not in traces[waited].own_error():
            return waited
        return None

    suspects = {r: suspect(t) for r, t in traces.items()}
    named = Counter(s for s in suspects.values() if s is not None)
    if named:
        slow, _ = named.most_common(1)[0]
        waiters = [r for r, s in suspects.items() if s == slow and r != slow]
        return (
            f"rank {slow} is behind (hung or slow): {ranks(waiters)} timed out in "
            f"{traces[waiters[0]].last().describe()} waiting for it; it was in "
            f"{state(traces[slow])}{stopped_by(traces, [slow])}"
        )
    last_seq = {r: max(t.calls(), default=-1) for r, t in traces.items()}
    front = max(last_seq.values())
    late = [r for r, s in last_seq.items() if s < front]
    if late and len(late) < len(traces):
        ahead = [r for r in traces if r not in late]
        verb = "is" if len(late) == 1 else "are"
        return (
            f"{ranks(late)} {verb} behind: {where(traces, late)}{stopped_by(traces, late)}, "
            f"while {where(traces, ahead)}"
        )
    return None


def stopped_by(traces: dict[int, RankTrace], rs) -> str:
    signals = {traces[r].signal for r in rs if traces[r].signal}
    return f" (stopped by {', '.join(sorted(signals))} there)" if signals else ""


def verdict_of(comm: str, traces: dict[int, RankTrace]) -> list[str]:
    size = max(t.size for t in traces.values())
    missing = [r for r in range(size) if r not in traces]
    present = sorted(traces)
    lines = []
    if missing:
        lost = {int(m) for t in traces.values() for m in LOST.findall(t.reason or "")}
        waited_on = {t.waited_for() for t in traces.values()}
        if set(missing) & waited_on and not set(missing) & lost:
            cause = "is hung or behind: it wrote no trace, and the others timed out waiting"
        else:
            cause = "died: it wrote no trace (killed by SIGKILL, the OOM killer or a crash)"
        lines.append(f"{ranks(missing)} {cause}; {where(traces, present)}")
    else:
        found = first_difference(traces) or behind(traces)
        signalled = [r for r in present if traces[r].signal]
        if found:
            lines.append(found)
        elif signalled:
            signals = ", ".join(sorted({traces[r].signal for r in signalled}))
            lines.append(f"{ranks(signalled)} got {signals} in {where(traces, signalled)}")
        else:
            first = min(present, key=lambda r: traces[r].last().end_us if traces[r].last() else 0)
            lines.append(f"rank {first} failed first; no rank differs or is behind")
    lines.append(f"communicator {comm!r}, {size} ranks:")
    for r in range(size):
        t = traces.get(r)
        if t is None:
            lines.append(f"  rank {r}: no trace")
            continue
        last = t.last()
        text = f"{last.describe()} [{last.algorithm}] {last.state}" if last else "no operation"
        extra = f", got {t.signal}" if t.signal else ""
        error = f": {t.reason}" if t.reason else ""
        lines.append(f"  rank {r}: {text}{extra}{error}")
    return lines


def verdict(directory: str | Path) -> list[str]:
    """The verdict on every communicator with traces in ``directory``, most recent first."""
    comms = read(directory)
    if not comms:
        raise FileNotFoundError(f"no *{SUFFIX} files in {directory} (is WEFT_TRACE_DIR set?)")

    def newest(item):
        return max((op.end_us or op.start_us for t in item[1].values() for op in t.ops), default=0)

    lines: list[str] = []
    for comm, traces in sorted(comms.items(), key=newest, reverse=True):
        lines += verdict_of(comm, traces)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m weft.trace", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("directory", help="the WEFT_TRACE_DIR the ranks wrote into")
    args = parser.parse_args(argv)
    try:
        lines = verdict(args.directory)
    except (OSError, ValueError) as exc:
        print(f"weft.trace: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
