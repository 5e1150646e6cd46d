"""One plain OS process per rank, for tests that kill ranks, read a rank's stderr or need a
fresh environment (weft reads its WEFT_* variables once per process).

Parent side: ``Ranks(fn, size, *args, env=...)`` hosts a TCPStore and starts ``python
weft_proc.py ...`` per rank; each child connects to the store and calls ``fn(rank, size, store,
*args)``, a module-level function of a test file. (The parent hosts the store so that a rank
that finishes, fails or is killed early does not take the store away from the others.)
``fn`` may call ``mark(text)`` to tell the parent it got somewhere; its JSON-able return value
comes back through ``Ranks.result``.
Every wait is bounded and ``Ranks.close`` kills whatever is still running.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
RESULT = "WEFT-RESULT "
MARK = "WEFT-MARK "
TOKEN_VAR = "WEFT_TEST_PROCESS_TOKEN"


# ---- child side -----------------------------------------------------------------------------


def mark(text: str) -> None:
    print(MARK + text, flush=True)


def outcome(thunk) -> dict:
    """Runs ``thunk()``; describes what it returned or raised, with timings."""
    start = time.monotonic()
    try:
        value = thunk()
        raised = None
    except Exception as exc:  # noqa: BLE001 - described to the parent
        value = None
        raised = exc
    info = {"elapsed": time.monotonic() - start, "time": time.time(), "raised": None}
    if raised is None:
        info["value"] = value
    else:
        info.update(
            raised=type(raised).__name__,
            mro=[cls.__name__ for cls in type(raised).__mro__],
            message=str(raised),
        )
    return info


def _connect_store(port: int):
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))


def _host_store():
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False
    )


def _child_main(path, name, rank, size, port, args_json):
    sys.path.insert(0, str(TESTS_DIR))
    spec = importlib.util.spec_from_file_location(f"weft_scenario_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        store = _connect_store(int(port))
        value = getattr(module, name)(int(rank), int(size), store, *json.loads(args_json))
        reply = {"ok": True, "value": value}
    except BaseException:  # noqa: BLE001 - reported to the parent
        reply = {"ok": False, "error": traceback.format_exc()}
    print(RESULT + json.dumps(reply), flush=True)


# ---- parent side ----------------------------------------------------------------------------


class _Child:
    def __init__(self, argv, env):
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.marks: dict[str, float] = {}
        self.result: dict | None = None
        self.changed = threading.Condition()
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream, is_stdout):
        for line in stream:
            with self.changed:
                if not is_stdout:
                    self.stderr.append(line)
                elif line.startswith(RESULT):
                    self.result = json.loads(line[len(RESULT) :])
                elif line.startswith(MARK):
                    self.marks[line[len(MARK) :].strip()] = time.time()
                else:
                    self.stdout.append(line)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, predicate, timeout):
        with self.changed:
            return self.changed.wait_for(
                lambda: predicate() or self.proc.poll() is not None, timeout
            )

    def join_readers(self, timeout=5):
        for t in self._threads:
            t.join(timeout)


class Ranks:
    """``size`` rank processes running ``fn``; use as a context manager (kills on exit)."""

    def __init__(self, fn, size, *args, env=None, env_per_rank=None):
        from weft_pool import clean_environ

        self.size = size
        self.token = uuid.uuid4().hex
        self._store = _host_store()
        port = self._store.port
        path = str(Path(sys.modules[fn.__module__].__file__).resolve())
        self.children = []
        for rank in range(size):
            extra = {
                TOKEN_VAR: self.token,
                **(env or {}),
                **(env_per_rank(rank) if env_per_rank else {}),
            }
            argv = [sys.executable, __file__, path, fn.__name__, str(rank), str(size), str(port)]
            self.children.append(_Child([*argv, json.dumps(list(args))], clean_environ(extra)))
        self.pids = [c.proc.pid for c in self.children]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_mark(self, rank: int, text: str, timeout: float) -> float:
        """Time (time.time()) at which ``rank`` called mark(text)."""
        child = self.children[rank]
        child.wait_for(lambda: text in child.marks, timeout)
        if text not in child.marks:
            raise AssertionError(f"rank {rank} never reached {text!r}{self._tail(rank)}")
        return child.marks[text]

    def result(self, rank: int, timeout: float):
        """The value ``fn`` returned on ``rank``; fails if it raised, died or took too long."""
        problem, value = self._outcome(rank, timeout)
        if problem:
            raise AssertionError(problem)
        return value

    def results(self, timeout: float) -> list:
        """Every rank's value; fails naming every rank that raised, died or took too long."""
        deadline = time.monotonic() + timeout
        outcomes = []
        for rank in range(self.size):
            outcomes.append(self._outcome(rank, max(0.0, deadline - time.monotonic())))
        problems = [problem for problem, _ in outcomes if problem]
        if problems:
            raise AssertionError("\n".join(problems))
        return [value for _, value in outcomes]

    def _outcome(self, rank: int, timeout: float) -> tuple[str | None, object]:
        child = self.children[rank]
        child.wait_for(lambda: child.result is not None, timeout)
        if child.result is None:
            child.wait_for(lambda: child.result is not None, 2)  # output racing the exit
        if child.result is None:
            code = child.proc.poll()
            state = f"no result in {timeout:.0f} s" if code is None else f"exited with code {code}"
            return f"rank {rank}: {state}{self._tail(rank)}", None
        if not child.result["ok"]:
            return f"rank {rank} failed:\n{child.result['error']}{self._tail(rank)}", None
        return None, child.result["value"]

    def wait_exit(self, rank: int, timeout: float) -> int | None:
        """The exit code of ``rank`` (None if it is still running after ``timeout``)."""
        try:
            return self.children[rank].proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stderr(self, rank: int) -> str:
        self.children[rank].join_readers()
        return "".join(self.children[rank].stderr)

    def stderr_so_far(self, rank: int) -> str:
        """What ``rank`` has written to stderr until now, while it runs."""
        child = self.children[rank]
        with child.changed:
            return "".join(child.stderr)

    def kill(self, rank: int) -> None:
        self.children[rank].proc.kill()

    def close(self) -> None:
        self._store = None
        for child in self.children:
            if child.proc.poll() is None:
                child.proc.kill()
        for child in self.children:
            child.proc.wait(10)
            child.join_readers()

    def _tail(self, rank: int, lines: int = 30) -> str:
        child = self.children[rank]
        with child.changed:
            err = "".join(child.stderr[-lines:])
            out = "".join(child.stdout[-lines:])
        return f"\n--- stdout:\n{out}--- stderr:\n{err}" if (err or out) else ""


def processes_with_token(token: str, kill: bool = True) -> list[int]:
    """Pids of live processes whose environment carries ``token`` (children included);
    kills them too unless told not to, so that a failing test leaves nothing behind."""
    found = []
    needle = f"{TOKEN_VAR}={token}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if needle in environ.split(b"\0") and "State:\tZ" not in status:
            found.append(int(entry.name))
    for pid in found if kill else ():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found


if __name__ == "__main__":
    _child_main(*sys.argv[1:])
