"""Coverage-guided fuzz targets (atheris) for weft's Python readers of files: an Algorithm's
JSON (``topo.load``) and MSCCL's XML (``topo.load_msccl``) from raw bytes; ``fields``: valid
Algorithm JSON with values swapped at fuzzer-chosen places for ones of other types and sizes
(raw bytes seldom get past the JSON parser); a Topology's JSON (``topology``,
``Topology.load``); and a flight-recorder file (``trace``, the verdict of ``python -m
weft.trace`` on it). Each must read the input or raise the reader's error saying what is wrong
(AlgorithmError, TopologyError, ValueError); any other exception is a bug the fuzzer reports.

    python tests/fuzz/fuzz_topo.py json|msccl|fields|topology|trace CORPUS_DIR [libFuzzer flags]

Seeds (every published MSCCL file, a built-in Algorithm per collective, a few Topologies, a
recorder file) are written into CORPUS_DIR when it is empty."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import atheris
import weft  # noqa: F401  (and torch with it, uninstrumented)

with atheris.instrument_imports(include=["weft.topo", "weft.trace"]):
    from weft import topo, trace
    from weft.topo.algorithm import AlgorithmError

SHARED_MSCCL = Path(__file__).resolve().parents[2].parent / "shared" / "msccl"
# A file on tmpfs: the readers take paths, as users give them.
SCRATCH = Path(tempfile.gettempdir() if not os.path.isdir("/dev/shm") else "/dev/shm")


TRACE_SEED = b"""weft-trace 1
comm default
rank 1
size 4
pid 4242
written_us 1700000000000000
reason allreduce #7 (ring) on rank 1: lost rank 2: peer process is gone
op seq=6 name=allreduce dtype=float32 reduce=sum count=1000 root=-1 algorithm=ring peers=0,2 \
state=done start_us=1 end_us=20
op seq=7 name=allreduce dtype=float32 reduce=sum count=1000 root=-1 algorithm=ring peers=0,2 \
state=failed start_us=30 end_us=0
"""  # a backslash at a line's end continues it


def seeds(kind: str) -> list[bytes]:
    if kind == "fields":
        return [bytes(8)]
    if kind == "trace":
        return [TRACE_SEED]
    if kind == "topology":
        worlds = [topo.Topology.hosts(2, 2, nic=(5e-6, 1e9, 1 << 18)).sharing_cpus(2, 1e-10),
                  topo.Topology.torus((2, 3)), topo.Topology.fat_tree(8, per_leaf=4)]  # fmt: skip
        return [json.dumps(w.to_json()).encode() for w in worlds]
    if kind == "msccl":
        return [p.read_bytes() for p in sorted(SHARED_MSCCL.glob("*.xml"))]
    out = []
    for collective, family, ranks in [
        ("allreduce", "ring", 3),
        ("allgather", "rhd", 4),
        ("reduce_scatter", "ring", 2),
        ("allreduce", "tree", 5),
    ]:
        path = SCRATCH / f"weft-fuzz-seed-{os.getpid()}.json"
        topo.builtin(collective, family, ranks, count=5).save(path)
        out.append(path.read_bytes())
        path.unlink()
    return out


ODD_VALUES = [None, True, False, 0, -1, 1, 2**63, -(2**63), 1.5, float("nan"), "", "x", [], {}, [0]]


def swap_fields(fdp, data):
    """``data`` with up to 4 values (at places the fuzzer picks) replaced by odd ones."""
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        parent, key = None, None
        node = data
        while isinstance(node, (dict, list)) and node and fdp.ConsumeBool():
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            parent, key = node, keys[fdp.ConsumeIntInRange(0, len(keys) - 1)]
            node = node[key]
        if parent is None:
            continue
        if fdp.ConsumeBool():
            parent[key] = fdp.PickValueInList(ODD_VALUES)
        elif isinstance(parent, dict):
            parent[fdp.ConsumeUnicodeNoSurrogates(8)] = parent.pop(key)
        else:
            del parent[key]
    return data


def fields_target():
    bases = [json.loads(seed) for seed in seeds("json")]

    def one_input(raw: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(raw)
        data = json.loads(json.dumps(bases[fdp.ConsumeIntInRange(0, len(bases) - 1)]))
        try:
            topo.Algorithm.from_json(swap_fields(fdp, data))
        except AlgorithmError:
            pass

    return one_input


def trace_target():
    # A directory per input, gone after it: libFuzzer ends the process with exit(), past
    # anything Python would clean up at exit.
    def one_input(data: bytes) -> None:
        directory = Path(tempfile.mkdtemp(prefix="weft-fuzz-trace-", dir=SCRATCH))
        path = directory / "fuzzed.rank0.weft-trace"
        path.write_bytes(data)
        try:
            trace.verdict(directory)
        except ValueError:
            pass
        finally:
            path.unlink()
            directory.rmdir()

    return one_input


def target(kind: str):
    if kind == "fields":
        return fields_target()
    if kind == "trace":
        return trace_target()
    if kind == "topology":
        path = SCRATCH / f"weft-fuzz-topology-{os.getpid()}"

        def load_topology(data: bytes) -> None:
            path.write_bytes(data)
            try:
                topo.Topology.load(path)
            except topo.TopologyError:
                pass
            except UnicodeDecodeError:
                pass  # not text
            finally:
                path.unlink()

        return load_topology
    path = SCRATCH / f"weft-fuzz-{kind}-{os.getpid()}"
    reader = topo.load if kind == "json" else topo.load_msccl

    def one_input(data: bytes) -> None:
        path.write_bytes(data)
        try:
            reader(path)
        except AlgorithmError:
            pass
        except UnicodeDecodeError:
            pass  # not text: Path.read_text says so, naming the byte
        finally:
            path.unlink()  # the fuzzer may end the process at any input: leave nothing behind

    return one_input


def main() -> None:
    kind, corpus = sys.argv[1], Path(sys.argv[2])
    corpus.mkdir(parents=True, exist_ok=True)
    if not any(corpus.iterdir()):
        for i, seed in enumerate(seeds(kind)):
            (corpus / f"seed{i}").write_bytes(seed)
    atheris.Setup([sys.argv[0], *sys.argv[3:], str(corpus)], target(kind))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
