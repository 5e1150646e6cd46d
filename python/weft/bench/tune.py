"""weft-bench --tune FILE: measures the tuner's cost model thoroughly (the long form of the
probe every communicator runs when it is created) and writes it for WEFT_TUNE=FILE.

Launched here, it measures shm and tcp in two launches of local ranks; under a launcher, the
links of that world. A transport no rank used keeps the built-in figures, and the file says so.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

from weft.bench import launch

TRANSPORTS = ("shm", "tcp")


def tune_rank(rank: int, size: int, store) -> dict:
    """One rank: a thorough probe; returns the agreed model and the transports this rank used."""
    import weft

    comm = weft.Communicator(store, rank, size, name="tune")
    model = comm.measure_cost_model(thorough=True)
    used = sorted({comm.transport_to(p) for p in range(size) if p != rank})
    links = {}
    for t in TRANSPORTS:
        link = getattr(model, t)
        links[t] = [link.alpha_s, link.beta_s_per_b, link.beta_large_s_per_b]
    sizes = [model.small_bytes, model.large_bytes]
    return {"links": links, "gamma_s_per_b": model.gamma_s_per_b, "sizes": sizes, "used": used}


def measure_here(size: int, timeout: float) -> list[dict]:
    """Every transport between `size` local ranks, one launch each (rank 0's view, plus the
    transports any rank used)."""
    from weft import local

    launches = []
    for transport in TRANSPORTS:
        env = {"WEFT_TRANSPORT": transport, "WEFT_TUNE": "off"}
        per_rank = local.spawn(tune_rank, size, env=env, timeout=timeout)
        launches.append(combine(per_rank))
    return launches


def combine(per_rank: list[dict]) -> dict:
    return {**per_rank[0], "used": sorted({t for r in per_rank for t in r["used"]})}


def build_model(launches: list[dict]):
    """The measured links over the built-in figures; the reduction cost is the slowest seen."""
    from weft import topo

    model = topo.CostModel()
    for run in launches:
        for t in run["used"]:
            setattr(model, t, topo.LinkCost(*run["links"][t]))
    model.gamma_s_per_b = max(run["gamma_s_per_b"] for run in launches)
    model.small_bytes, model.large_bytes = launches[0]["sizes"]  # the same probe every launch
    return model


def write(path: Path, model, size: int, measured: list[str], how: str) -> None:
    unmeasured = [t for t in TRANSPORTS if t not in measured]
    header = [
        f"# weft cost model: weft-bench --tune, {size} ranks {how}, on {platform.node()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}",
        f"# measured: {', '.join(measured)}",
    ]
    if unmeasured:
        header.append(f"# built-in figures (no rank used them): {', '.join(unmeasured)}")
    path.write_text("\n".join(header) + "\n" + str(model))


def run(path: Path, size: int, launcher: launch.Launcher | None, timeout: float) -> int:
    if size < 2:
        raise SystemExit("weft-bench --tune: needs at least 2 ranks to measure links")
    if launcher:
        import torch.distributed as dist

        store = dist.PrefixStore("tune", launch.rendezvous(launcher))
        out = tune_rank(launcher.rank, launcher.size, store)
        store.set(f"used/{launcher.rank}", ",".join(out["used"]))
        if launcher.rank != 0:
            return 0
        used = {t for r in range(size) for t in store.get(f"used/{r}").decode().split(",") if t}
        launches, how = [{**out, "used": sorted(used)}], f"under {launcher.name}"
    else:
        launches, how = measure_here(size, timeout), "launched here"
    model = build_model(launches)
    measured = sorted({t for run in launches for t in run["used"]})
    write(path, model, size, measured, how)
    print(f"# cost model written to {path} (use it with WEFT_TUNE={path})\n{model}", end="")
    return 0
