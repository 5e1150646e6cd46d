"""The verbs emulator (tests/verbs_emulator/) behaves as an RC device would, between two real
processes: what weft's ibverbs back end is tested over proves only as much as this does."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from rdma_support import VerbsEmulatorUnavailable, verbs_emulator, verbs_emulator_selftest

TIMEOUT_S = 20


@pytest.fixture(scope="module")
def built() -> tuple[Path, Path]:
    try:
        return verbs_emulator(), verbs_emulator_selftest()
    except VerbsEmulatorUnavailable as e:
        pytest.skip(str(e))


class Side:
    """One emu_selftest process; its stdout read line by line in a thread."""

    def __init__(self, built, scenario, role, env, opts, prefix=()) -> None:
        lib, client = built
        args = [*prefix, str(client), str(lib), scenario, role]
        args += [f"{k}={v}" for k, v in opts.items()]
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def expect(self, prefix: str) -> str:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no {prefix} line in {TIMEOUT_S} s; got {self.lines}"
                ) from None
            if line is None:
                raise AssertionError(f"exited before {prefix}: {self.lines} {self.stderr()}")
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def say(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        rc = self.proc.wait(timeout=TIMEOUT_S)
        while (line := self._q.get(timeout=TIMEOUT_S)) is not None:
            self.lines.append(line)
        return rc

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.poll() is not None else ""

    def elapsed_ms(self) -> int:
        return next(int(x.split()[1]) for x in self.lines if x.startswith("ELAPSED_MS"))

    def assert_ok(self, rc: int) -> None:
        failed = [x for x in self.lines if x.startswith("FAIL")]
        assert rc == 0 and not failed and "DONE" in self.lines, (
            rc,
            failed,
            self.lines,
            self.stderr(),
        )


def pair(
    built,
    tmp_path,
    scenario,
    send_env=None,
    recv_env=None,
    send_opts=None,
    recv_opts=None,
    kill_before_go=False,
    kill_after_s=None,
    recv_prefix=(),
):
    """Runs scenario between a sending and a receiving process; returns both sides, finished
    (a killed receiver is not checked)."""
    base = {"WEFT_VERBS_EMU_DIR": str(tmp_path / "sock")}
    send = Side(built, scenario, "send", {**base, **(send_env or {})}, send_opts or {})
    recv = Side(built, scenario, "recv", {**base, **(recv_env or {})}, recv_opts or {}, recv_prefix)
    try:
        info = [side.expect("INFO").split()[1:] for side in (send, recv)]
        send.say("PEER " + " ".join(info[1]))
        recv.say("PEER " + " ".join(info[0]))
        send.expect("READY")
        recv.expect("READY")
        if kill_before_go:
            recv.proc.send_signal(signal.SIGKILL)
            recv.proc.wait(timeout=TIMEOUT_S)
        else:
            recv.say("GO")
        send.say("GO")
        if kill_after_s is not None:
            time.sleep(kill_after_s)
            recv.proc.send_signal(signal.SIGKILL)
        send.assert_ok(send.finish())
        if recv.proc.poll() is None or recv.proc.returncode >= 0:
            if recv.proc.poll() is None:
                # A scenario that does not hold the receiver lets it end on its own, maybe
                # between poll() and this line; finish() below checks how it ended.
                with contextlib.suppress(BrokenPipeError):
                    recv.say("CLOSE")
            recv.assert_ok(recv.finish())
    finally:
        for side in (send, recv):
            if side.proc.poll() is None:
                side.proc.kill()
                side.proc.wait()
    return send, recv


def stats_of(directory: Path, side: Side) -> dict:
    return json.loads((directory / f"verbs_emu.{side.proc.pid}.json").read_text())


@pytest.mark.parametrize("gid_index", [0, 3])  # link-local, IPv4-mapped
def test_write_with_imm_lands_with_its_bytes_and_imm(built, tmp_path, gid_index):
    stats = tmp_path / "stats"
    stats.mkdir()
    env = {"WEFT_VERBS_EMU_STATS": str(stats)}
    opts = {"gid_index": gid_index}
    send, recv = pair(built, tmp_path, "imm", env, env, opts, opts)
    assert "OK the bytes landed, and only there" in recv.lines
    gid = next(x for x in send.lines if x.startswith("INFO")).split()[3]
    assert gid.startswith("00000000000000000000ffff" if gid_index >= 2 else "fe80"), gid
    s, r = stats_of(stats, send), stats_of(stats, recv)
    assert (s["writes_with_imm"], s["writes"], s["payload_bytes"]) == (2, 0, 4000)
    assert s["wire_messages"] == 3  # the hello and the two requests
    assert r["receives_consumed"] == 2
    assert r["acks_sent"] in (1, 2)  # coalesced or not
    assert r["wire_messages"] == 1 + r["acks_sent"]  # its own hello
    assert not list((tmp_path / "sock").iterdir()), "a context left its socket behind"


def test_many_in_flight_stay_in_order(built, tmp_path):
    pair(built, tmp_path, "order", send_opts={"n": 3000}, recv_opts={"n": 3000})


@pytest.mark.parametrize("scenario", ["rkey", "bounds", "access"])
def test_bad_remote_key_range_or_access_fails_and_flushes(built, tmp_path, scenario):
    send, recv = pair(built, tmp_path, scenario)
    assert any("remote access error" in x for x in send.lines)
    assert "OK receiver QP in ERR" in recv.lines


def test_local_protection_error(built, tmp_path):
    pair(built, tmp_path, "lkey")


def test_state_machine_and_masks(built, tmp_path):
    send, recv = pair(built, tmp_path, "states")
    for side in (send, recv):
        assert "OK post_send refused in INIT" in side.lines
        assert "OK post_send refused in RTR" in side.lines


def test_receiver_not_ready_exceeds_rnr_retry(built, tmp_path):
    send, _ = pair(
        built, tmp_path, "rnr", send_opts={"rnr_retry": 2}, recv_opts={"min_rnr_timer": 1}
    )
    assert send.elapsed_ms() < 2000


def test_receiver_not_ready_then_retried_into_a_late_receive(built, tmp_path):
    stats = tmp_path / "stats"
    stats.mkdir()
    env = {"WEFT_VERBS_EMU_STATS": str(stats)}
    send, recv = pair(
        built, tmp_path, "rnr_late", send_env=env, recv_env=env, recv_opts={"min_rnr_timer": 14}
    )
    assert stats_of(stats, recv)["rnr_naks_sent"] >= 1
    assert stats_of(stats, send)["retransmissions"] >= 1


def test_dead_peer_retry_exceeded_within_bound(built, tmp_path):
    send, _ = pair(built, tmp_path, "dead", send_opts={"n": 3}, kill_before_go=True)
    assert 100 <= send.elapsed_ms() < 2000
    assert len(list((tmp_path / "sock").iterdir())) == 1  # the killed one's
    pair(built, tmp_path, "imm")
    assert not list((tmp_path / "sock").iterdir()), "a dead process's socket was left"


def test_peer_killed_with_writes_in_flight(built, tmp_path):
    send, _ = pair(
        built,
        tmp_path,
        "dead",
        send_opts={"n": 2},
        recv_env={"WEFT_VERBS_EMU_FAULT": "rnr"},
        kill_after_s=0.3,
    )
    assert 300 <= send.elapsed_ms() < 3000


def test_injected_retry_exceeded(built, tmp_path):
    pair(built, tmp_path, "inject", send_env={"WEFT_VERBS_EMU_FAULT": "retry_exceeded:3"})


@pytest.mark.parametrize("how", ["fault", "small_cq"])
def test_cq_overflow_raises_an_async_event(built, tmp_path, how):
    if how == "fault":
        pair(built, tmp_path, "overflow", recv_env={"WEFT_VERBS_EMU_FAULT": "cq_overflow:4"})
    else:
        pair(built, tmp_path, "overflow", recv_opts={"cqe": 4})


def test_injected_device_fatal(built, tmp_path):
    pair(built, tmp_path, "fatal", send_env={"WEFT_VERBS_EMU_FAULT": "device_fatal:100"})


def test_no_device(built):
    lib, client = built
    run = subprocess.run(
        [str(client), str(lib), "nodevice", "send"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "WEFT_VERBS_EMU_FAULT": "no_device"},
        check=False,
    )
    assert run.returncode == 0 and "OK empty device list" in run.stdout, run.stdout + run.stderr


def test_large_writes_cross_in_pieces(built, tmp_path):
    opts = {"buf": 16 << 20}
    pair(built, tmp_path, "large", send_opts=opts, recv_opts=opts)


def test_many_in_flight_over_three_qps(built, tmp_path):
    opts = {"n": 1500, "qps": 3}
    pair(built, tmp_path, "order", send_opts=opts, recv_opts=opts)


def test_posting_polling_and_event_threads(built, tmp_path):
    pair(built, tmp_path, "threads")


def test_teardown_with_work_outstanding(built, tmp_path):
    pair(built, tmp_path, "busy", recv_env={"WEFT_VERBS_EMU_FAULT": "rnr"})


def test_send_queue_slots_free_only_when_completions_are_polled(built, tmp_path):
    pair(built, tmp_path, "full")


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare"
)
def test_across_network_namespaces(built, tmp_path):
    """The sockets are files, so ranks in network namespaces of their own reach each other."""
    pair(built, tmp_path, "imm", recv_prefix=("unshare", "--net"))
