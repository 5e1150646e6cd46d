"""A pool of long-lived rank processes that run test cases on a shared Communicator.

Starting a world costs time (each rank makes a Communicator, which connects and probes its
links), so the tests keep one pool per (world size, transport) for the whole session and send it
*cases*: module-level functions ``fn(ctx, *args)`` that every rank runs; their return values come
back to the parent in rank order.

Every wait in the parent is bounded. A rank that raises, dies or hangs fails the call with a
report naming each rank's state (and the last case it announced with ``ctx.note``), and the
pool is killed; the next call for the same key starts a fresh one.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import sys
import time
import traceback
from pathlib import Path

import rdma_backends
import weft.local

TESTS_DIR = Path(__file__).resolve().parent

# Seconds a rank waits inside weft before giving up; the parent waits longer than that.
COMM_TIMEOUT_S = 30.0
START_TIMEOUT_S = 180.0
RUN_TIMEOUT_S = 300.0

# How each pool's ranks are configured. "tcp" gives every rank its own host identity, so weft
# must pick TCP by itself; "tcp-forced" keeps one host and forces TCP with WEFT_TRANSPORT.
# The "-small" ones shrink every connection to four 4 KiB slots, so that modest counts already
# cross many slices and chunked rounds; "hosts-of-2" puts ranks 2k and 2k+1 on one host
# identity (shm inside, tcp across), with small slots too. "shm-8-channels" gives every pair
# eight connection sets (WEFT_CHANNELS), as Plans of eight channel tags need. "shm-cma" sends
# messages from 4 KiB by reference (the peer reads them with process_vm_readv). The "cuda-" ones
# (shm between ranks) choose how the torch backend moves CUDA tensors: pinned host staging, or
# cuda_ipc with its default staging buffers or with 4 KiB ones, so that modest counts take many
# rounds. "ofi-tcp" runs the RDMA protocol over libfabric's tcp provider (messages over 64 KiB
# take the rendezvous path), "ofi-tcp-small" with four 4 KiB slots (every message eager, credits
# running out), "ofi-shm" over libfabric's shm provider (FI_EP_RDM endpoints). "ibverbs" runs it
# over weft's ibverbs back end and the tests' verbs emulator (tests/verbs_emulator/),
# "ibverbs-small" with four 4 KiB slots, "ibverbs-2qps" with two queue pairs per peer.
TRANSPORTS = (
    "shm",
    "tcp",
    "tcp-forced",
    "shm-small",
    "shm-cma",
    "tcp-small",
    "shm-8-channels",
    "hosts-of-2",
    "cuda-staging",
    "cuda-ipc",
    "cuda-ipc-small",
    "cuda-auto",
    "cuda-nccl",
    "cuda-nccl-plans",
    "ofi-tcp",
    "ofi-tcp-small",
    "ofi-shm",
    "ibverbs",
    "ibverbs-small",
    "ibverbs-2qps",
)

SMALL_SLOTS = {
    "WEFT_SHM_SLOT_BYTES": "4096",
    "WEFT_SHM_SLOTS": "4",
    "WEFT_TCP_SLOT_BYTES": "4096",
    "WEFT_TCP_SLOTS": "4",
}


def transport_env(transport: str, rank: int) -> dict[str, str]:
    if transport == "shm":
        return {"WEFT_TRANSPORT": "shm"}
    if transport == "tcp":
        return {"WEFT_HOST_ID": f"weft-test-host-{rank}"}
    if transport == "tcp-forced":
        return {"WEFT_TRANSPORT": "tcp"}
    if transport == "shm-small":
        return {"WEFT_TRANSPORT": "shm", **SMALL_SLOTS}
    if transport == "shm-cma":
        return {"WEFT_TRANSPORT": "shm", "WEFT_SHM_CMA": "1", "WEFT_SHM_CMA_MIN_BYTES": "4096"}
    if transport == "tcp-small":
        return {"WEFT_HOST_ID": f"weft-test-host-{rank}", **SMALL_SLOTS}
    if transport == "shm-8-channels":
        return {"WEFT_TRANSPORT": "shm", "WEFT_CHANNELS": "8", **SMALL_SLOTS}
    if transport == "hosts-of-2":
        return {"WEFT_HOST_ID": f"weft-test-host-{rank // 2}", **SMALL_SLOTS}
    if transport == "cuda-staging":
        return {"WEFT_TRANSPORT": "shm", "WEFT_CUDA_PATH": "staging"}
    if transport == "cuda-ipc":
        return {"WEFT_TRANSPORT": "shm", "WEFT_CUDA_PATH": "ipc"}
    if transport == "cuda-auto":
        return {"WEFT_TRANSPORT": "shm"}
    if transport == "cuda-nccl":
        return {"WEFT_TRANSPORT": "shm", "WEFT_CUDA_PATH": "nccl"}
    if transport == "cuda-nccl-plans":
        # 4 KiB steps: most operations take several rounds of the Plans.
        return {
            "WEFT_TRANSPORT": "shm",
            "WEFT_CUDA_PATH": "nccl",
            "WEFT_NCCL_MODE": "plans",
            "WEFT_NCCL_STEP_BYTES": "4096",
        }
    if transport in ("ofi-tcp", "ofi-tcp-small"):
        # The ofi transport over libfabric's tcp provider, one host identity per rank.
        small = SMALL_SLOTS if transport == "ofi-tcp-small" else {}
        host = {"WEFT_HOST_ID": f"weft-test-host-{rank}"}
        return {**rdma_backends.env("ofi"), **host, **small}
    if transport == "ofi-shm":
        # libfabric's shm provider: FI_EP_RDM endpoints, one host.
        return {"WEFT_TRANSPORT": "ofi", "FI_PROVIDER": "shm"}
    if transport in ("ibverbs", "ibverbs-small", "ibverbs-2qps"):
        small = SMALL_SLOTS if transport == "ibverbs-small" else {}
        qps = {"WEFT_IB_QPS_PER_PEER": "2"} if transport == "ibverbs-2qps" else {}
        host = {"WEFT_HOST_ID": f"weft-test-host-{rank}"}
        return {**rdma_backends.env("ibverbs"), **host, **small, **qps}
    if transport == "cuda-ipc-small":
        return {
            "WEFT_TRANSPORT": "shm",
            "WEFT_CUDA_PATH": "ipc",
            "WEFT_CUDA_IPC_CHUNK_BYTES": "4096",
        }
    raise ValueError(f"unknown transport {transport!r}")


def clean_environ(extra: dict[str, str]) -> dict[str, str]:
    """The current environment without any WEFT_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEFT_")}
    env.update(extra)
    return env


class PoolError(AssertionError):
    """A case failed on some rank (raised, died or hung)."""


class WorkerContext:
    """What a case function gets on each rank."""

    def __init__(self, rank, size, store, comm, note_buf):
        self.rank = rank
        self.size = size
        self.store = store
        self.comm = comm
        self._note_buf = note_buf
        self._names = 0

    def note(self, text: str) -> None:
        """Records what this rank is doing, reported by the parent if the rank hangs."""
        self._note_buf.value = text.encode()[: len(self._note_buf) - 1]

    def fresh_name(self, prefix: str) -> str:
        """A communicator name not used before in this pool (same on every rank)."""
        self._names += 1
        return f"{prefix}-{self._names}"


def _load_function(path: str, name: str, cache: dict):
    module = cache.get(path)
    if module is None:
        spec = importlib.util.spec_from_file_location(f"weft_case_{Path(path).stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cache[path] = module
    return getattr(module, name)


def _worker_main(rank, size, port, env, conn, note_buf):
    faulthandler.enable()  # a crash prints the Python stack into the test's captured output
    for key in [k for k in os.environ if k.startswith("WEFT_")]:
        del os.environ[key]
    os.environ.update(env)
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    try:
        import weft
        import weft.local

        store = weft.local.make_store(rank, size, port)
        comm = weft.Communicator(store, rank, size, timeout=COMM_TIMEOUT_S)
        ctx = WorkerContext(rank, size, store, comm, note_buf)
        conn.send(("ok", os.getpid()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))
        return
    modules: dict = {}
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        path, name, args, kwargs = message
        ctx.note(f"{name} (started)")
        try:
            result = _load_function(path, name, modules)(ctx, *args, **kwargs)
            reply = ("ok", result)
        except BaseException:  # noqa: BLE001 - reported to the parent
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except BaseException:  # noqa: BLE001 - an unpicklable result
            conn.send(("error", traceback.format_exc()))


def _shorten(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more chars)"


# Ranks are forked from a server process that has imported weft (and with it torch) once, so a
# rank starts in a fraction of a second instead of the seconds a fresh interpreter takes to import
# torch, and exits without tearing torch down. weft reads its WEFT_* variables when the first
# communicator is made, which is after _worker_main has set them. The server keeps the environment
# of the moment the first pool started: a rank gets its variables through transport_env, never
# from a change to os.environ in the test process.
_PROCESSES = mp.get_context("forkserver")
_PROCESSES.set_forkserver_preload(["numpy", "torch", "weft", "weft.local", "weft_pool"])


class Pool:
    """``size`` rank processes, each with one weft.Communicator over one TCPStore."""

    def __init__(self, size: int, transport: str):
        self.size = size
        self.transport = transport
        self.closed = False
        port = weft.local.free_port()
        self._conns = []
        self._notes = []
        self._procs = []
        for rank in range(size):
            parent_end, child_end = _PROCESSES.Pipe()
            note = _PROCESSES.RawArray("c", 512)
            proc = _PROCESSES.Process(
                target=_worker_main,
                args=(rank, size, port, transport_env(transport, rank), child_end, note),
                name=f"weft-pool-{transport}-{size}-r{rank}",
                daemon=True,
            )
            proc.start()
            child_end.close()
            self._conns.append(parent_end)
            self._notes.append(note)
            self._procs.append(proc)
        self.pids = self._collect("start-up", START_TIMEOUT_S)

    def __repr__(self):
        return f"Pool(size={self.size}, transport={self.transport!r})"

    def run(self, fn, *args, timeout: float = RUN_TIMEOUT_S, **kwargs) -> list:
        """Runs ``fn(ctx, *args, **kwargs)`` on every rank; returns the results in rank order."""
        if self.closed:
            raise PoolError(f"{self!r} is closed")
        path = str(Path(sys.modules[fn.__module__].__file__).resolve())
        for note in self._notes:
            note.value = b""
        for conn in self._conns:
            conn.send((path, fn.__name__, args, kwargs))
        return self._collect(fn.__name__, timeout)

    def _collect(self, what: str, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        results: dict[int, object] = {}
        errors: dict[int, str] = {}
        pending = set(range(self.size))
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready = mpc.wait([self._conns[r] for r in pending], timeout=remaining)
            for conn in ready:
                rank = self._conns.index(conn)
                pending.discard(rank)
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    self._procs[rank].join(timeout=5)
                    errors[rank] = (
                        f"process died (exit code {self._procs[rank].exitcode}); "
                        f"last case: {self._last_case(rank)}"
                    )
                    continue
                if status == "ok":
                    results[rank] = value
                else:
                    errors[rank] = value
            if errors:
                # The others may wait for the failed rank until weft's own timeout fires.
                deadline = min(deadline, time.monotonic() + COMM_TIMEOUT_S + 15)
        if not errors and not pending:
            return [results[r] for r in range(self.size)]
        report = [f"{self!r}: {what} failed"]
        for rank in range(self.size):
            if rank in errors:
                report.append(f"--- rank {rank} failed:\n{errors[rank].rstrip()}")
            elif rank in results:
                report.append(f"--- rank {rank} returned: {_shorten(repr(results[rank]))}")
            elif rank in pending:
                report.append(
                    f"--- rank {rank} gave no answer within {timeout:.0f} s (hung?); "
                    f"last case: {self._last_case(rank)}"
                )
        self.close()
        raise PoolError("\n".join(report))

    def _last_case(self, rank: int) -> str:
        """What the rank last announced with ``ctx.note``."""
        return self._notes[rank].value.decode(errors="replace") or "?"

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        for conn in self._conns:
            conn.close()


class PoolRegistry:
    """Hands out one live pool per (size, transport); keeps at most ``max_alive`` of them."""

    def __init__(self, max_alive: int = 3):
        self.max_alive = max_alive
        self._pools: dict[tuple[int, str], Pool] = {}

    def get(self, size: int, transport: str) -> Pool:
        key = (size, transport)
        pool = self._pools.pop(key, None)
        if pool is None or pool.closed:
            while len(self._pools) >= self.max_alive:
                oldest = next(iter(self._pools))
                self._pools.pop(oldest).close()
            pool = Pool(size, transport)
        self._pools[key] = pool  # most recently used last
        return pool

    def close_all(self) -> None:
        while self._pools:
            self._pools.popitem()[1].close()
