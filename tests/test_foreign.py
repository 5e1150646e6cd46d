"""Foreign and broken input on every port weft listens on, for as long as it listens: random
bytes, truncated hellos, a length of 2^63 where a hello's fields are, a valid hello of another
job (right protocol, wrong secret), a valid hello whose sender leaves once challenged, hellos
naming no socket of the mesh, a connection sending one byte a second, and a thousand connections
at once on each port. Ranks held in bootstrap (the last
one starts late) take all of it, the last one's listener too (it accepts no peer: every rank
connects to the lower ones), then build the mesh and compute correct allreduces within the
timeout; the strangers are dropped and logged at INFO by every rank that serves its port, and
nothing listens once the mesh is built."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time

import pytest
from stranger import CHALLENGE_BYTES, HELLO_MAGIC, hello, impostor, recv_exactly
from test_auth import (
    COUNTS,
    PREFIX,
    TIMEOUT_S,
    finish,
    go_files,
    held_then_allreduce,
    release,
    wait_listening,
)
from weft_proc import Ranks

FLOOD = 1000
SIZE = 4


def send_and_close(port: int, data: bytes, linger: float = 0.0) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(data)
            time.sleep(linger)
    except OSError:  # refused once the mesh is built, or reset by the rank: both fine
        pass


def garbage(rng: random.Random) -> list[bytes]:
    """One of each kind of broken input."""
    valid = hello(1, 0, 0, rng.randbytes(32))
    return [
        rng.randbytes(rng.choice([1, 47, 48, 49, 4096, 65536])),  # random bytes
        valid[: rng.randrange(1, len(valid))],  # a truncated hello
        struct.pack("<IQQ", HELLO_MAGIC, 2**63, 2**63) + bytes(28),  # 2^63 where lengths go
        struct.pack("<Q", 2**63) * 6,  # 2^63 from the first byte
        hello(SIZE + 5, 0, 0, bytes(32)),  # from a rank outside the world
        hello(3, 0, 99, bytes(32)),  # a socket index the mesh does not have
        hello(3, 2, 0, bytes(32)),  # meant for another rank
        valid * 3,  # a hello and more than the handshake allows
    ]


class Attacker:
    """Keeps attacking each rank's port (``ports``: rank -> port) from several threads until
    stopped or refused, and holds a thousand silent connections open on each of them."""

    def __init__(self, ports: dict[int, int]):
        self.ports = list(ports.values())
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._garbage, args=(p,)) for p in self.ports]
        self.threads += [threading.Thread(target=self._slow, args=(p,)) for p in self.ports]
        for rank, port in ports.items():
            self.threads.append(threading.Thread(target=self._impostor, args=(port, rank)))
            self.threads.append(threading.Thread(target=self._abandon, args=(port, rank)))
        self.flood: list[socket.socket] = []
        self.sent = 0

    def __enter__(self):
        for t in self.threads:
            t.start()
        # A thousand connections at once on every port, left open and silent.
        for port in self.ports:
            for _ in range(FLOOD):
                s = socket.socket()
                s.setblocking(False)
                try:
                    s.connect(("127.0.0.1", port))
                except BlockingIOError:
                    pass
                self.flood.append(s)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)
        for s in self.flood:
            s.close()

    def flooding(self) -> int:
        """How many of the silent connections the ports' kernels have taken so far."""
        taken = 0
        for s in self.flood:
            try:
                s.getpeername()
                taken += 1
            except OSError:  # still connecting: the listen queue is full
                pass
        return taken

    def _garbage(self, port):
        rng = random.Random(port)
        while not self.stop.is_set():
            for data in garbage(rng):
                send_and_close(port, data, linger=0.01)
                self.sent += 1

    def _slow(self, port):
        """One byte a second of a hello for rank 0, for as long as the port takes them."""
        data = hello(1, 0, 0, bytes(32))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                for byte in data:
                    if self.stop.wait(1.0):
                        return
                    s.sendall(bytes([byte]))
        except OSError:
            pass

    def _impostor(self, port, rank):
        while not self.stop.is_set():
            try:
                impostor(port, b"another job's secret", PREFIX, SIZE, sender=SIZE - 1, to=rank)
            except OSError:
                pass
            self.stop.wait(0.05)

    def _abandon(self, port, rank):
        """A valid hello for ``rank``, then gone once challenged. Answered hellos are the last
        connections a crowd sheds, so the rank reads this close, however many strangers wait."""
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(hello(SIZE - 1, rank, 0, random.randbytes(32)))
                    recv_exactly(s, CHALLENGE_BYTES)
            except OSError:
                pass
            self.stop.wait(0.05)


# What every rank that serves its port must log, one line per stranger dropped.
WHYS = [
    "not a weft hello of this version",
    "names no socket of this mesh",
    "too many connections waiting at once",
    "closed before completing the handshake",
    "wrong proof of the job secret",
]


def unlogged(stderr: str) -> list[str]:
    """The drop reasons ``stderr`` does not have yet."""
    drops = [line for line in stderr.splitlines() if "dropped a connection" in line]
    return [why for why in WHYS if not any(why in line for line in drops)]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_strangers_on_every_port_never_stop_the_job(tmp_path, transport):
    go = go_files(tmp_path)
    env = {"WEFT_TRANSPORT": transport, "WEFT_DEBUG": "INFO", "WEFT_TUNE": "off"}
    with Ranks(held_then_allreduce, SIZE, go, COUNTS, env=env) as ranks:
        held = list(range(SIZE - 1))
        ports = {rank: sockets[0][1] for rank, sockets in wait_listening(ranks, held).items()}
        start = time.monotonic()
        with Attacker(ports) as attacker:
            time.sleep(2)  # listening, waiting for the last rank's address
            release(go[0])
            # The last rank listens from now on, held before it connects: attacked too.
            last_port = wait_listening(ranks, [SIZE - 1])[SIZE - 1][0][1]
            with Attacker({SIZE - 1: last_port}) as last_attacker:
                # The others serve their ports, waiting for the last rank's sockets, until each
                # has met every kind of stranger (the bootstrap's timeout bounds how long).
                serving = time.monotonic()
                while time.monotonic() - serving < 8 and any(
                    unlogged(ranks.stderr_so_far(rank)) for rank in held
                ):
                    time.sleep(0.1)
                # The last rank never accepts: its queue fills, and holds what it took until it
                # closes.
                assert last_attacker.flooding() > 0
                # ... and attacked still while they build the mesh and run.
                finish(ranks, go, timeout=TIMEOUT_S + 30)
        elapsed = time.monotonic() - start
    assert attacker.sent > 0
    assert elapsed < TIMEOUT_S + 30
    for rank in held:  # every rank that serves its port (the last one never does)
        missing = unlogged(ranks.stderr(rank))
        assert not missing, f"rank {rank} dropped no connection with {missing}"
