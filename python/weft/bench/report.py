"""The table on stdout (nccl-tests' layout), and the JSON and CSV files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from weft.bench import ops
from weft.bench.ops import OPS
from weft.bench.sizes import human

FORMAT = "weft-bench/1"
CSV_FIELDS = (
    "system op bytes count dtype redop root in_place time_us algbw_GBps busbw_GBps wrong "
    "cpu_us cpu_sys_us".split()
)
LEAD = (10, 12, 8, 6, 6)  # size, count, type, redop, root: nccl-tests' widths
FORM = (7, 6, 6, 6)  # time, algbw, busbw, #wrong


def cols(values, widths) -> str:
    return "".join(f"  {v:>{w}}" for v, w in zip(values, widths))


def iter_bytes(config: dict) -> str:
    b = config.get("iter_bytes", 0)
    return f" --iter-bytes {human(b)}" if b else ""


def header(config: dict) -> list[str]:
    c = config
    return [
        f"# weft-bench: {c['world_size']} ranks ({c['launcher']}), {c['dtype']}, "
        f"-n {c['iters']}{iter_bytes(c)} -w {c['warmup']} -c {int(c['check'])}, "
        f"rounds {c.get('rounds', 1)}, repeats {c['repeats']}, "
        f"tensors on {'huge' if c.get('huge_pages') else 'default'} pages "
        f"(THP_MEM_ALLOC_ENABLE={int(bool(c.get('huge_pages')))})",
        f"# time: {c['timing']}",
        f"# bandwidth: {c['bandwidth']}",
    ]


def system_block(name: str, op: str, records: list[dict]) -> list[str]:
    """nccl-tests' table of one system and op: a row per size, out-of-place then in-place."""
    lines = [
        "#",
        f"# {name}: {op}",
        "#" + cols([""] * 5, LEAD) + f"{'out-of-place':^33}{'in-place':^33}",
        "#"
        + cols(["size", "count", "type", "redop", "root"], LEAD)
        + cols(["time", "algbw", "busbw", "#wrong"], FORM) * 2,
        "#"
        + cols(["(B)", "(elements)", "", "", ""], LEAD)
        + cols(["(us)", "(GB/s)", "(GB/s)", ""], FORM) * 2,
    ]
    rows: dict[int, dict[bool, dict]] = {}
    for r in records:
        rows.setdefault(r["bytes"], {})[r["in_place"]] = r
    busbw = []
    for nbytes, forms in sorted(rows.items()):
        first = next(iter(forms.values()))
        type_name = ops.DISPLAY_NAME[ops.DTYPES[first["dtype"]]]
        lead = [nbytes, first["count"], type_name, first["redop"] or "none", first["root"]]
        line = " " + cols(lead, LEAD)
        for in_place in (False, True):
            r = forms.get(in_place)
            if r is None:
                line += cols(["n/a", "", "", ""], FORM)
                continue
            busbw.append(r["busbw_GBps"])
            wrong = "N/A" if r["wrong"] is None else r["wrong"]
            bws = [f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}"]
            line += cols([fmt_time(r["time_us"]), *bws, wrong], FORM)
        lines.append(line)
    if busbw:
        lines.append(f"# Avg bus bandwidth    : {sum(busbw) / len(busbw):.4g} GB/s")
    return lines + chosen_algorithms(records)


def chosen_algorithms(records: list[dict]) -> list[str]:
    """What a system that chooses (weft's auto) ran at each size, launches that chose
    differently joined by '/'; nothing for a system that ran one algorithm throughout."""
    by_size: dict[int, dict[str, None]] = {}
    for r in records:
        for algorithm in r.get("algorithm_runs", []):
            by_size.setdefault(r["bytes"], {})[algorithm] = None
    if len({a for algos in by_size.values() for a in algos}) < 2:
        return []
    cells = [f"{nbytes} {'/'.join(algos)}" for nbytes, algos in sorted(by_size.items())]
    return ["# algorithm: " + ", ".join(cells)]


def fmt_time(us: float) -> str:
    return f"{us:.2f}" if us < 10000 else f"{us:.0f}"


def fmt_num(x: float) -> str:
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3g}"


def compared_form(op: str, records: list[dict]) -> tuple[str, list[dict], list[str]]:
    """The form every peer offers for `op` (its name), the records of `op` in it, and the
    systems they come from in order of appearance."""
    in_place = OPS[op].compared_in_place
    mine = [r for r in records if r["op"] == op and r["in_place"] == in_place]
    systems = list(dict.fromkeys(r["system"] for r in mine))
    return ("in-place" if in_place else "out-of-place"), mine, systems


def comparison_block(op: str, records: list[dict], ratios: list[dict]) -> list[str]:
    """Every system's busbw per size in the op's compared form, and the ratios weft/peer."""
    form, mine, systems = compared_form(op, records)
    if len(systems) < 2:
        return []
    pairs = list(dict.fromkeys((q["system"], q["peer"]) for q in ratios if q["op"] == op))
    widths = [10] + [12] * len(systems) + [16] * len(pairs)
    lines = [
        "#",
        f"# {op}, {form}: busbw (GB/s) side by side, and weft/peer (busbw ratio, > 1: weft "
        "is faster)",
        "#" + cols(["size", *systems, *(f"{a}/{b}" for a, b in pairs)], widths),
    ]
    bw = {(r["system"], r["bytes"]): r["busbw_GBps"] for r in mine}
    ratio = {(q["system"], q["peer"], q["bytes"]): q["ratio"] for q in ratios if q["op"] == op}
    for nbytes in sorted({r["bytes"] for r in mine}):
        cells = [fmt_num(bw[s, nbytes]) if (s, nbytes) in bw else "–" for s in systems]
        for a, b in pairs:
            x = ratio.get((a, b, nbytes))
            cells.append(fmt_num(x) if x is not None else "–")
        lines.append(" " + cols([nbytes, *cells], widths))
    return lines


def cpu_block(op: str, records: list[dict]) -> list[str]:
    """Every system's CPU time per call in the op's compared form: what the call cost the
    machine over all ranks, and the kernel's share of it."""
    form, mine, systems = compared_form(op, records)
    if not systems:
        return []
    widths = [10] + [18] * len(systems)
    lines = [
        "#",
        f"# {op}, {form}: CPU time per call over all ranks (us, user + system, waiting "
        "included; in brackets the kernel's share)",
        "#" + cols(["size", *systems], widths),
    ]
    at = {(r["system"], r["bytes"]): r for r in mine}
    for nbytes in sorted({r["bytes"] for r in mine}):
        cells = [cpu_cell(at.get((system, nbytes))) for system in systems]
        lines.append(" " + cols([nbytes, *cells], widths))
    return lines


def cpu_cell(r: dict | None) -> str:
    if r is None:
        return "–"
    return f"{fmt_time(r['cpu_us'])} ({r['cpu_sys_us'] / r['cpu_us']:.0%})"


def table(report: dict) -> str:
    lines = header(report["config"])
    for s in report["systems"]:
        if s["status"] != "ok":
            lines.append(f"# {s['name']}: {s['status']}: {s['reason']}")
    records = report["results"]
    for op in report["config"]["ops"]:
        for s in report["systems"]:
            mine = [r for r in records if r["system"] == s["name"] and r["op"] == op]
            if mine:
                lines += system_block(s["name"], op, mine)
            elif op in s.get("refused", {}):
                lines += ["#", f"# {s['name']}: {op}: not run: {s['refused'][op]}"]
        lines += comparison_block(op, records, report["ratios"])
        lines += cpu_block(op, records)
    notes = [n for s in report["systems"] for n in s.get("unsupported", [])]
    if notes:
        lines += ["#", "# n/a (not offered by the system's API): " + "; ".join(notes)]
    wrong = sum(r["wrong"] or 0 for r in records)
    lines += ["#", f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
    return "\n".join(lines) + "\n"


def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps({"format": FORMAT, **report}, indent=1) + "\n")


def write_csv(records: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
