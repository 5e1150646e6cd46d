"""From raw per-rank timings to the records the reports show.

A launch's time per call at one (op, size, form) is its slowest rank's; with --rounds, the
median over the rounds of each round's slowest rank, the rounds kept in `time_us_rounds`.
#wrong is the sum over ranks. The CPU time per call (`cpu_us`, user and system, of which the
kernel's part is `cpu_sys_us`; timing.py says how they are taken) is the sum over ranks and
the mean over a launch's blocks; with several launches, both figures come from the launch of
median CPU time (the lower of the middle two for an even count). With --repeats, the reported
time is the median over the launches, whose times are kept in `time_us_runs`, and where the
system says which algorithm it ran (weft), each launch's in `algorithm_runs`, and the untimed
calls it spent trying algorithms first in `trial_calls_runs`. Bandwidths as nccl-tests
defines them, GB = 1e9 bytes: algbw = bytes / time, busbw = algbw x the op's factor
(ops.Op.bus_factor).
"""

from __future__ import annotations

import statistics

from weft.bench.ops import OPS

KEY = ("op", "bytes", "in_place")


def combine_ranks(per_rank: list[dict]) -> dict:
    """One launch: every rank's run_plan() output -> one output, slowest rank's times."""
    first = per_rank[0]
    records = []
    for at_ranks in zip(*(out["records"] for out in per_rank)):
        record = dict(at_ranks[0])
        record["time_s"] = max(r["time_s"] for r in at_ranks)
        if "round_times_s" in record:
            slowest = [max(rounds) for rounds in zip(*(r["round_times_s"] for r in at_ranks))]
            record["round_times_s"] = slowest
            record["time_s"] = statistics.median(slowest)
        blocks = [r["round_cpu_s"] for r in at_ranks]
        assert len({len(b) for b in blocks}) == 1, "the ranks timed different numbers of blocks"
        # Per block, (all, the kernel's) summed over the ranks.
        record["round_cpu_s"] = [[sum(x) for x in zip(*b)] for b in zip(*blocks)]
        wrongs = [r["wrong"] for r in at_ranks]
        record["wrong"] = None if None in wrongs else sum(wrongs)
        records.append(record)
    return {**first, "records": records}


def finish(system: str, runs: list[dict], plan: dict, n: int) -> list[dict]:
    """The records of one system over its launches (median time), with bandwidths."""
    by_key: dict[tuple, list[dict]] = {}
    for run in runs:
        for record in run["records"]:
            by_key.setdefault(tuple(record[k] for k in KEY), []).append(record)
    out = []
    for same in by_key.values():
        op = OPS[same[0]["op"]]
        times = [r["time_s"] for r in same]
        wrongs = [r["wrong"] for r in same]
        t = statistics.median(times)
        algbw = same[0]["bytes"] / t / 1e9
        out.append(
            {
                "system": system,
                "op": op.name,
                "bytes": same[0]["bytes"],
                "count": same[0]["count"],
                "dtype": plan["dtype"],
                "redop": "sum" if op.reduces else None,
                "root": plan["root"] if op.rooted else -1,
                "in_place": same[0]["in_place"],
                "iters": same[0]["iters"],
                "time_us": sig(t * 1e6),
                "algbw_GBps": sig(algbw),
                "busbw_GBps": sig(algbw * op.bus_factor(n)),
                "wrong": None if None in wrongs else sum(wrongs),
                "time_us_runs": [sig(x * 1e6) for x in times],
            }
        )
        cpu, kernel = statistics.median_low(launch_cpu(r["round_cpu_s"]) for r in same)
        out[-1]["cpu_us"] = sig(cpu * 1e6)
        out[-1]["cpu_sys_us"] = sig(kernel * 1e6)
        if any("round_times_s" in r for r in same):
            out[-1]["time_us_rounds"] = [[sig(x * 1e6) for x in r["round_times_s"]] for r in same]
        if any("algorithm" in r for r in same):
            out[-1]["algorithm_runs"] = [r.get("algorithm") for r in same]
            out[-1]["trial_calls_runs"] = [r.get("trial_calls", 0) for r in same]
    return out


def launch_cpu(blocks: list[list[float]]) -> tuple[float, float]:
    """(all, the kernel's) CPU seconds per call of one launch: the mean over its blocks,
    which hold equally many calls."""
    cpu, kernel = zip(*blocks)
    return statistics.fmean(cpu), statistics.fmean(kernel)


def ratios(records: list[dict], weft_systems: list[str], peers: list[str]) -> list[dict]:
    """busbw of each weft system / each peer's, per op and size, in the op's compared form."""
    at = {
        (r["system"], r["op"], r["bytes"]): r
        for r in records
        if r["in_place"] == OPS[r["op"]].compared_in_place
    }
    out = []
    for (system, op, nbytes), mine in at.items():
        if system not in weft_systems:
            continue
        for peer in peers:
            theirs = at.get((peer, op, nbytes))
            if theirs:
                ratio = sig(theirs["time_us"] / mine["time_us"])  # = busbw ratio
                out.append(
                    {
                        "op": op,
                        "bytes": nbytes,
                        "in_place": mine["in_place"],
                        "system": system,
                        "peer": peer,
                        "ratio": ratio,
                    }
                )
    return out


def sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")
