"""A rank SIGKILLed while the communicator is created (docs/failures.md), world size 4, the
victim rank 1, at the three moments of the bootstrap (the second also under attack):

- before it reached the store: no rank can tell it from a slow one; the others raise after the
  store's timeout an error saying that rank 1 never joined;
- after it published its address, before any connection: the survivors raise within 2 s a
  PeerError naming rank 1 (the ranks that connect to it find its port refused, the rank it owes
  a connection sees its listener gone);
- the same while strangers flood every listening rank's port (test_foreign's attacker): the
  same;
- during the handshakes (it connected to rank 0, which had not answered yet): the same.

The mesh is built over TCP whatever WEFT_TRANSPORT says; the transports' own setup after it is
test_failure.py's "create" case. Ranks are held at the right moment by a file the test
creates ("go"), and rank 0 by SIGSTOP."""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import timedelta
from pathlib import Path

from test_auth import wait_listening
from test_foreign import Attacker
from weft_proc import Ranks, outcome, processes_with_token

TIMEOUT_S = 10.0
KILL_BOUND_S = 2.0
STORE_TIMEOUT_S = 3.0  # case "never joined": the store's wait ends the bootstrap
VICTIM = 1
LISTENING = "bootstrap: listening on"


GATE_VAR = "BOOTSTRAP_TEST_GATED"  # set on the ranks that wait for the gate


def scenario_create(rank, size, store, case, gate_dir):
    """Waits for the gate where told, then creates the communicator; what the creation
    raised, and when."""
    import weft

    if case == "never-joined":
        store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
    go = Path(gate_dir) / "go"
    deadline = time.monotonic() + 120
    while os.environ.get(GATE_VAR) and not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    info = outcome(lambda: weft.Communicator(store, rank, size, name=case, timeout=TIMEOUT_S))
    info.pop("value", None)
    return info


def wait_stderr(ranks, proc: int, text: str, timeout: float) -> None:
    child = ranks.children[proc]
    if not child.wait_for(lambda: any(text in line for line in child.stderr), timeout):
        raise AssertionError(f"process {proc} never logged {text!r}\n{ranks._tail(proc)}")


def run_case(tmp_path: Path, case: str, gated: set[int], act) -> tuple[dict, float]:
    """Runs the case's 4 ranks, INFO logs on; ``act(ranks, open_gate)`` does the case's
    deeds and returns the time of the kill. The survivors' outcomes, and that time."""
    env = {"WEFT_TRANSPORT": "tcp", "WEFT_DEBUG": "INFO"}
    per_rank = {r: {GATE_VAR: "1"} for r in gated}
    with Ranks(
        scenario_create, 4, case, str(tmp_path), env=env, env_per_rank=lambda r: per_rank.get(r, {})
    ) as ranks:
        killed_at = act(ranks, lambda: (tmp_path / "go").touch())
        got = {r: ranks.result(r, timeout=TIMEOUT_S + 30) for r in range(4) if r != VICTIM}
        token = ranks.token
    time.sleep(0.3)
    assert processes_with_token(token) == [], "processes left behind"
    return got, killed_at


def assert_named_fast(got: dict, killed_at: float) -> None:
    problems = []
    for rank, info in got.items():
        message = info.get("message") or ""
        delay = info["time"] - killed_at
        if info["raised"] != "PeerError":
            problems.append(f"rank {rank}: expected PeerError, got {info}")
        elif delay > KILL_BOUND_S:
            problems.append(f"rank {rank}: raised {delay:.2f} s after the kill: {message}")
        elif not re.search(rf"\brank {VICTIM}\b.*(refused|gone)", message):
            problems.append(f"rank {rank}: does not name rank {VICTIM} as gone: {message!r}")
        elif "creating communicator" not in message:
            problems.append(f"rank {rank}: does not say it was creation: {message!r}")
    assert not problems, "\n".join(problems)


def test_killed_after_publishing_its_address(tmp_path):
    """Rank 1 listens and published its address, then waits for rank 0's (held back)."""

    def act(ranks, open_gate):
        wait_stderr(ranks, VICTIM, LISTENING, timeout=60)
        time.sleep(0.2)
        os.kill(ranks.pids[VICTIM], signal.SIGKILL)
        killed_at = time.time()
        open_gate()
        return killed_at

    assert_named_fast(*run_case(tmp_path, "published", {0}, act))


def test_killed_while_strangers_flood_every_listener(tmp_path):
    """As after publishing, with strangers on the listening ranks' ports all along (test_foreign's
    attacker: garbage, a slow sender, impostors, a thousand silent connections each): a full
    listen queue and strangers to drop hide nothing, the survivors name rank 1 within 2 s."""

    def act(ranks, open_gate):
        listening = [r for r in range(4) if r != 0]  # rank 0 is held before it listens
        ports = {r: sockets[0][1] for r, sockets in wait_listening(ranks, listening).items()}
        with Attacker(ports) as attacker:
            time.sleep(0.5)  # the flood is in the queues and the strangers are being served
            assert attacker.flooding() > 0
            os.kill(ranks.pids[VICTIM], signal.SIGKILL)
            killed_at = time.time()
            open_gate()
            time.sleep(KILL_BOUND_S + 0.5)  # still attacked while the survivors find out
            assert attacker.sent > 0
        return killed_at

    assert_named_fast(*run_case(tmp_path, "flooded", {0}, act))


def test_killed_during_the_handshakes(tmp_path):
    """Rank 0 is stopped once it listens; rank 1 connects to it and waits for its answer
    when it is killed; then rank 0 goes on."""

    def act(ranks, open_gate):
        wait_stderr(ranks, 0, LISTENING, timeout=60)
        os.kill(ranks.pids[0], signal.SIGSTOP)
        open_gate()
        wait_stderr(ranks, VICTIM, LISTENING, timeout=60)
        time.sleep(0.5)  # it reads the addresses, connects to rank 0 and sends its hello
        os.kill(ranks.pids[VICTIM], signal.SIGKILL)
        killed_at = time.time()
        os.kill(ranks.pids[0], signal.SIGCONT)
        return killed_at

    assert_named_fast(*run_case(tmp_path, "handshakes", {1, 2, 3}, act))


def test_never_joined_is_reported_after_the_store_timeout(tmp_path):
    """Rank 1 never creates its communicator (it is killed at the gate): the others raise,
    after the store's timeout, a TimeoutError saying that rank 1 never joined."""

    def act(ranks, _open_gate):
        os.kill(ranks.pids[VICTIM], signal.SIGKILL)
        return time.time()

    got, killed_at = run_case(tmp_path, "never-joined", {VICTIM}, act)
    problems = []
    for rank, info in got.items():
        message = info.get("message") or ""
        if info["raised"] != "TimeoutError" or f"rank {VICTIM} never joined" not in message:
            problems.append(f"rank {rank}: expected 'rank {VICTIM} never joined': {info}")
        elif info["time"] - killed_at > STORE_TIMEOUT_S + KILL_BOUND_S + 3:
            problems.append(f"rank {rank}: took {info['time'] - killed_at:.1f} s")
    assert not problems, "\n".join(problems)
