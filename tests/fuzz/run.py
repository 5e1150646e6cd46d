"""Builds and runs every fuzz target for a while; prints (or writes as JSON) what each did.

    python tests/fuzz/run.py --seconds 600 --json bench/results/fuzz/fuzz.json

C++ targets (fuzz_*.cc here) are libFuzzer programs built with Debian's clang
(``make install-fuzz``) with AddressSanitizer and UBSan, from the core's own sources; Python
targets (fuzz_topo.py) run under atheris. A target whose tool is missing is reported as
skipped with the reason. Each run keeps its corpus (seeded on first use) under --work, so a
longer run goes on from a shorter one; a crash leaves its input there and fails the run."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CORE = REPO / "csrc" / "core"

# target: the core sources it links, and seeds for its corpus.
CPP_TARGETS = {
    "fuzz_wire": {
        "sources": ["bootstrap/address.cc", "bootstrap/handshake.cc",
                    "bootstrap/abort_notice.cc", "common/sha256.cc", "common/error.cc"],
        "seeds": [],
    },
    "fuzz_tcp_stream": {
        "sources": ["transport/tcp/tcp_connection.cc", "bootstrap/socket.cc",
                    "transport/op_signature.cc", "common/error.cc", "common/types.cc"],
        # Expect operation 7, 4 bytes, into the caller's buffer; the peer sends two such
        # messages, then one of another length.
        "seeds": [struct.pack("<QHB", 7, 4, 0) + (struct.pack("<QQ", 4, 7) + b"abcd") * 2
                  + struct.pack("<QQ", 5, 7) + b"abcde"],
    },
    "fuzz_shm_fifo": {
        "sources": ["transport/shm/*.cc", "bootstrap/socket.cc", "reduce/cpu_reduce*.cc",
                    "transport/op_signature.cc", "common/config.cc", "common/log.cc",
                    "common/error.cc", "common/types.cc"],
        # Expect operation 7, 40 bytes, through recv_slot, 2 slots of 40 bytes: the peer
        # posts two messages in slot data, lets the receiver take one, then posts two by
        # reference, at offset 0 of its 256 KiB buffer and one that runs past its end. Then
        # 4 bytes into the caller's buffer, 1 slot: two messages in their headers.
        "seeds": [struct.pack("<QHB", 7, 40, 0b1001)
                  + (struct.pack("<BBQ", 3, 1, 0) + bytes(range(40))) * 2
                  + struct.pack("<BB", 5, 0) + struct.pack("<BBQ", 3, 2, 0)
                  + struct.pack("<BBQ", 3, 2, (256 << 10) - 39),
                  struct.pack("<QHB", 7, 4, 0) + (struct.pack("<BBQ", 3, 3, 0) + b"abcd") * 2],
    },
    "fuzz_rdma_protocol": {
        "sources": ["transport/rdma/rdma_connection.cc", "transport/rdma/registration_cache.cc",
                    "bootstrap/socket.cc", "transport/op_signature.cc", "common/error.cc",
                    "common/types.cc"],
        # Ops: 1 post, 4 complete a write of ours, 5 clear-to-send, 6 payload, 7 send,
        # 8 sends_complete, 9 yield, 10 release. Expect operation 7, 16 bytes, through
        # recv_slot holding the messages, 2 slots of 16 bytes: the peer posts two eager
        # messages, the receiver takes both (a yield of one more try) and releases the first,
        # while we send one eagerly and the peer completes our writes (the credit and the
        # message) until sends complete.
        # Then 64 KiB + 100 bytes (a rendezvous), 1 slot of 64 bytes: the receiver clears the
        # message before it comes, the peer posts its ready-to-send and clears our 70-byte
        # rendezvous send into its buffer (offset 4096: its start, past the guard), completes
        # our three writes, then writes 100 bytes of its payload.
        "seeds": [struct.pack("<QHBB", 7, 16, 0b10000011, 3)
                  + struct.pack("<BB", 1, 0) + bytes(range(16))
                  + struct.pack("<BB", 1, 0) + bytes(range(16, 32)) + struct.pack("<BBB", 9, 1, 10)
                  + struct.pack("<BBI", 7, 0, 16) + struct.pack("<BBBBB", 4, 0, 4, 0, 8),
                  struct.pack("<QHBB", 7, 100, 0b101000, 3) + struct.pack("<BBBB", 9, 0, 1, 1)
                  + struct.pack("<BBI", 7, 0, 70) + struct.pack("<BBBIB", 5, 0, 0, 4096, 8)
                  + struct.pack("<BBBBBBBBB", 4, 0, 4, 0, 4, 0, 8, 9, 0)
                  + struct.pack("<BB", 6, 0) + bytes(range(100))],
    },
    "fuzz_p2p": {
        "sources": ["exec/p2p.cc", "exec/backoff.cc", "exec/cpu_placement.cc", "exec/work.cc",
                    "common/config.cc", "common/log.cc", "common/error.cc", "common/types.cc"],
        # Ops: 0 bytes, 1 message, 2 header alone, 3 receive (source 0: rank 0, 1: rank 2,
        # 2: any), 4 send, 7 settle. Slots of 64 bytes: a receive from rank 2 posted before
        # its message; rank 0 sends 100 bytes with tag 2, then 6, before their receives (set
        # aside): one from any rank takes the first, a 4-byte one is refused the second; a
        # 70-byte send to rank 0. While a receive from rank 0 with tag 3 waits, rank 2 sends
        # 4 bytes of a 10-byte message with tag 0; its receive is posted before the other 6.
        # Then 16-byte slots: rank 0 and rank 2 each send a header claiming 2^62 bytes and 300
        # of them; rank 0's has a receive of 8 bytes (refused, its payload drained), rank 2's
        # none (set aside as it arrives).
        "seeds": [struct.pack("<B", 1) + struct.pack("<BBBH", 3, 1, 1, 5)
                  + struct.pack("<BBBH", 1, 1, 1, 5) + b"hello"
                  + struct.pack("<BBBH", 1, 0, 2, 100) + bytes(range(100))
                  + struct.pack("<BBBH", 1, 0, 2, 6) + b"abcdef" + struct.pack("<B", 7)
                  + struct.pack("<BBBH", 3, 2, 2, 100) + struct.pack("<BBBH", 3, 0, 2, 4)
                  + struct.pack("<BBBH", 4, 0, 3, 70) + struct.pack("<BBBH", 3, 0, 3, 1)
                  + struct.pack("<BBBQ", 2, 1, 0, 10) + struct.pack("<BBH", 0, 1, 4) + b"0123"
                  + struct.pack("<B", 7) + struct.pack("<BBBH", 3, 1, 0, 10)
                  + struct.pack("<BBH", 0, 1, 6) + b"456789",
                  struct.pack("<B", 0) + struct.pack("<BBBH", 3, 0, 3, 8)
                  + struct.pack("<BBBQ", 2, 0, 3, 1 << 62) + struct.pack("<BBBQ", 2, 1, 1, 1 << 62)
                  + struct.pack("<BBH", 0, 0, 300) + b"\x55" * 300
                  + struct.pack("<BBH", 0, 1, 300) + b"\xaa" * 300 + struct.pack("<B", 7)],
    },
    "fuzz_cost_model": {
        "sources": ["tune/cost_model.cc", "common/error.cc", "algo/*.cc"],
        "seeds": [b"shm_alpha_s 1e-6\nshm_beta_s_per_b 1e-10\ntcp_alpha_s 2e-5\n"
                  b"tcp_beta_s_per_b 1e-9\ngamma_s_per_b 1e-10\n# a comment\n"],
    },
}  # fmt: skip
PY_TARGETS = ["json", "msccl", "fields", "topology", "trace"]
FLAGS = ["-std=c++17", "-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover"]


def clang() -> str | None:
    for name in ("clang++", "clang++-14", "clang++-15", "clang++-16"):
        if shutil.which(name):
            return name
    return None


def build(name: str, work: Path) -> Path:
    """The target's binary, built once per content of its sources (cached under ``work``)."""
    sources = [HERE / f"{name}.cc"]
    for pattern in CPP_TARGETS[name]["sources"]:
        sources += sorted(CORE.glob(pattern))
    digest = hashlib.sha256()
    for path in [*sources, *sorted(CORE.rglob("*.h")), *sorted(HERE.glob("*.h"))]:
        digest.update(path.read_bytes())
    work.mkdir(parents=True, exist_ok=True)
    binary = work / f"{name}-{digest.hexdigest()[:16]}"
    if not binary.exists():
        cmd = [clang(), *FLAGS, f"-I{REPO / 'csrc'}", *map(str, sources), "-o", f"{binary}.tmp"]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(f"{binary}.tmp", binary)
    return binary


def corpus(work: Path, name: str, seeds: list[bytes]) -> Path:
    path = work / "corpus" / name
    path.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds):
        (path / f"seed{i}").write_bytes(seed)
    return path


STATS = re.compile(r"#(\d+)\s+(?:DONE|pulse|NEW|REDUCE|INITED)\s+cov: (\d+) ft: (\d+) corp: (\d+)")


def parse(output: str, rc: int, artifacts: Path) -> dict:
    lines = STATS.findall(output)
    runs, cov, ft, corp = map(int, lines[-1]) if lines else (0, 0, 0, 0)
    crashes = sorted(p.name for p in artifacts.glob("*") if p.is_file())
    return {"ok": rc == 0 and not crashes, "executions": runs, "coverage_edges": cov,
            "features": ft, "corpus_files": corp, "crashes": crashes,
            "tail": "" if rc == 0 else output[-3000:]}  # fmt: skip


def run_cpp(name: str, seconds: int, work: Path) -> dict:
    if clang() is None:
        return {"skipped": "no clang++ (make install-fuzz installs Debian's clang)"}
    try:
        binary = build(name, work)
    except subprocess.CalledProcessError as e:
        if "fuzzer" in e.stderr and "cannot find" in e.stderr:
            return {"skipped": "clang has no libFuzzer runtime (Debian: libclang-rt-*-dev)"}
        raise
    artifacts = work / "crashes" / name
    artifacts.mkdir(parents=True, exist_ok=True)
    cmd = [str(binary), f"-max_total_time={seconds}", f"-artifact_prefix={artifacts}/",
           "-rss_limit_mb=1024", "-print_final_stats=1",
           str(corpus(work, name, CPP_TARGETS[name]["seeds"]))]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    return parse(proc.stderr, proc.returncode, artifacts)


def run_py(kind: str, seconds: int, work: Path) -> dict:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return {"skipped": "no atheris (make install-fuzz installs it from PyPI)"}
    artifacts = work / "crashes" / f"topo_{kind}"
    artifacts.mkdir(parents=True, exist_ok=True)
    target_corpus = work / "corpus" / f"topo_{kind}"
    cmd = [sys.executable, str(HERE / "fuzz_topo.py"), kind, str(target_corpus),
           f"-max_total_time={seconds}", f"-artifact_prefix={artifacts}/",
           "-rss_limit_mb=2048"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 180)
    return parse(proc.stderr, proc.returncode, artifacts)


def run_all(seconds: int, work: Path, jobs: int = 2) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    tasks = {f"cpp:{n}": (run_cpp, n) for n in CPP_TARGETS}
    tasks.update({f"atheris:topo_{k}": (run_py, k) for k in PY_TARGETS})
    with ThreadPoolExecutor(jobs) as pool:
        futures = {key: pool.submit(fn, arg, seconds, work) for key, (fn, arg) in tasks.items()}
        return {key: f.result() for key, f in futures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "weft-fuzz")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    results = run_all(args.seconds, args.work)
    text = json.dumps({"seconds_per_target": args.seconds, "targets": results}, indent=1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    sys.exit(0 if all(r.get("ok", True) for r in results.values()) else 1)


if __name__ == "__main__":
    main()
