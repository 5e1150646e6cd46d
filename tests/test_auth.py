"""Who may connect (docs/security.md): SHA-256 and HMAC-SHA256 against their standard vectors;
ranks prove they know the job's secret on every bootstrap socket (WEFT_JOB_SECRET, or one rank 0
draws and shares through the Store); a stranger without it is dropped and logged while the job
goes on; listeners bind only the address WEFT_SOCKET_ADDR or WEFT_SOCKET_IFNAME names, and close
once the mesh is built."""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import socket
import time

import numpy as np
import pytest
from listeners import listening
from stranger import CHALLENGE_MAGIC, impostor, mac
from weft_proc import Ranks, mark

TIMEOUT_S = 20.0
PREFIX = "weft/default"


# ---- SHA-256 and HMAC-SHA256 ----------------------------------------------------------------

SHA256_VECTORS = [  # FIPS 180-4 examples (NIST CSRC)
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (
        b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
    ),
    (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
]

HMAC_VECTORS = [  # RFC 4231 test cases 1, 2, 3, 4, 6, 7
    (b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (
        b"Jefe",
        b"what do ya want for nothing?",
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
    ),
    (
        b"\xaa" * 20,
        b"\xdd" * 50,
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
    ),
    (
        bytes(range(1, 26)),
        b"\xcd" * 50,
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
    ),
    (
        b"\xaa" * 131,
        b"Test Using Larger Than Block-Size Key - Hash Key First",
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
    ),
    (
        b"\xaa" * 131,
        b"This is a test using a larger than block-size key and a larger than block-size data. "
        b"The key needs to be hashed before being used by the HMAC algorithm.",
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
    ),
]


def test_sha256_matches_the_standard_vectors():
    from weft._C import wire

    for data, digest in SHA256_VECTORS:
        assert wire.sha256(data).hex() == digest, f"sha256 of {len(data)} bytes"
    # Every length around the 64-byte block and its 56-byte padding boundary, against hashlib.
    rng = random.Random(5)
    for n in [*range(0, 200), 1000, 4095, 4096, 65537]:
        data = rng.randbytes(n)
        assert wire.sha256(data) == hashlib.sha256(data).digest(), f"sha256 of {n} bytes"


def test_hmac_sha256_matches_rfc4231():
    from weft._C import wire

    for key, data, digest in HMAC_VECTORS:
        assert wire.hmac_sha256(key, data).hex() == digest, f"key of {len(key)} bytes"
    rng = random.Random(7)
    for key_len in (0, 1, 63, 64, 65, 200):
        key, data = rng.randbytes(key_len), rng.randbytes(rng.randrange(300))
        assert wire.hmac_sha256(key, data) == hmac.new(key, data, hashlib.sha256).digest()


# ---- ranks held in bootstrap ----------------------------------------------------------------


def wait_for_file(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


class HeldStore:
    """A rank's store, except that once the rank has published its address its reads wait for
    ``go_file``: the other ranks, having read every address, then wait in the accept loop."""

    def __init__(self, store, go_file: str):
        self.store, self.go_file, self.published = store, go_file, False

    def set(self, key, value):
        self.store.set(key, value)
        self.published = self.published or "/addr/" in key

    def get(self, key):
        if self.published:
            wait_for_file(self.go_file, 60)
        return self.store.get(key)


def held_then_allreduce(rank, size, store, go_files, counts):
    """The last rank starts only once ``go_files[0]`` exists (the others wait for its address
    with their ports open but not yet served), and after publishing its address reads on only
    once ``go_files[1]`` does (the others wait in the accept loop). Then every rank says what it
    listens on and counts wrong elements of allreduces against numpy."""
    import weft

    if rank == size - 1:
        wait_for_file(go_files[0], 60)
        store = HeldStore(store, go_files[1])
    comm = weft.Communicator(store, rank, size, timeout=TIMEOUT_S)
    after = listening(os.getpid())
    mark("built")
    return {"listening_after": after, "wrong": wrong_in_allreduces(comm, counts)}


def wrong_in_allreduces(comm, counts) -> int:
    """Allreduces of each count, checked against numpy: how many elements came out wrong."""
    wrong = 0
    for count in counts:
        x = (np.arange(count) % 7 + comm.rank).astype(np.float32)
        comm.allreduce(x)
        want = sum((np.arange(count) % 7 + r) for r in range(comm.size)).astype(np.float32)
        wrong += int(np.count_nonzero(x != want))
    return wrong


def go_files(tmp_path) -> list[str]:
    return [str(tmp_path / "start"), str(tmp_path / "connect")]


def release(path: str) -> None:
    open(path, "w").close()


COUNTS = [0, 1, 7, 1000, 65_537]


def wait_listening(ranks: Ranks, held: list[int], timeout: float = 60) -> dict[int, list]:
    """What each rank in ``held`` listens on, once each has a listener."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {r: listening(ranks.pids[r]) for r in held}
        if all(found.values()):
            return found
        time.sleep(0.05)
    raise AssertionError(f"ranks {held} never listened")


def finish(ranks: Ranks, go: list[str], timeout: float = 60) -> list[dict]:
    """Lets the held rank go on; checks every rank's results and that none listens any more."""
    for path in go:
        release(path)
    results = ranks.results(timeout)
    for rank, r in enumerate(results):
        assert r["wrong"] == 0, f"rank {rank}: {r['wrong']} wrong elements"
        assert r["listening_after"] == [], f"rank {rank} still listens: {r['listening_after']}"
    return results


SECRET = "correct horse battery staple"


# Each listen setting on a rank of its own (rank 3 starts late): (env, the address it listens on).
LISTEN_SETTINGS = [
    ({"WEFT_SOCKET_ADDR": "127.0.0.1"}, "127.0.0.1"),
    ({"WEFT_SOCKET_IFNAME": "lo"}, "127.0.0.1"),
    ({}, "0.0.0.0"),
    ({}, None),
]


@pytest.mark.parametrize("secret", ["from-env", "drawn"])
def test_only_ranks_with_the_secret_get_in_on_the_named_address(tmp_path, secret):
    """Listeners bind the named address (or every one); a stranger with a valid hello but the
    wrong secret is dropped and logged while the job goes on; nothing listens once built."""
    go = go_files(tmp_path)
    env = {"WEFT_TRANSPORT": "tcp", "WEFT_DEBUG": "INFO", "WEFT_TUNE": "off"}
    if secret == "from-env":
        env["WEFT_JOB_SECRET"] = SECRET
    size = len(LISTEN_SETTINGS)
    per_rank = lambda rank: LISTEN_SETTINGS[rank][0]  # noqa: E731
    with Ranks(held_then_allreduce, size, go, COUNTS, env=env, env_per_rank=per_rank) as ranks:
        during = wait_listening(ranks, list(range(size - 1)))
        for rank, sockets in during.items():
            want = LISTEN_SETTINGS[rank][1]
            assert [ip for ip, _ in sockets] == [want], f"rank {rank} listens on {sockets}"
        release(go[0])  # rank 0 serves its port once rank 3 has published its address
        # Plays rank 3, the one still missing: a valid hello, then a proof from a wrong secret.
        seen = impostor(during[0][0][1], b"guessed", PREFIX, size, sender=size - 1, to=0)
        challenge = seen["challenge"]
        assert len(challenge) == 68 and int.from_bytes(challenge[:4], "little") == CHALLENGE_MAGIC
        if "WEFT_JOB_SECRET" in env:
            # The challenge is HMAC over both nonces, and the secret itself never travels.
            args = (SECRET.encode(), PREFIX, size, size - 1, 0, 0, seen["nonce"], challenge[4:36])
            want = mac("weft accept", *args)
            assert challenge[36:] == want
            assert SECRET.encode() not in challenge
        assert seen["closed"], "rank 0 kept a connection whose proof was wrong"
        finish(ranks, go)
        for sockets in during.values():
            for _, port in sockets:
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert "dropped a connection from 127.0.0.1" in ranks.stderr(0)
    assert "wrong proof of the job secret" in ranks.stderr(0)


def build_comm(rank, size, store):
    import weft

    start = time.monotonic()
    try:
        weft.Communicator(store, rank, size, timeout=5.0)
    except Exception as exc:  # noqa: BLE001 - described to the parent
        return {
            "raised": type(exc).__name__,
            "message": str(exc),
            "after": time.monotonic() - start,
        }
    return {"raised": None}


def test_ranks_with_different_secrets_fail_saying_so():
    secrets = {0: "one", 1: "two"}
    with Ranks(build_comm, 2, env_per_rank=lambda r: {"WEFT_JOB_SECRET": secrets[r]}) as ranks:
        results = ranks.results(30)
    assert results[1]["raised"] == "InvalidArgument", results
    assert "WEFT_JOB_SECRET" in results[1]["message"] and "rank 0" in results[1]["message"]
    # Rank 0 sees rank 1's listener go once rank 1's creation failed (docs/failures.md).
    assert results[0]["raised"] == "PeerError", results
    assert "rank 1 left" in results[0]["message"], results
    assert all(r["after"] < 5.0 + 2 for r in results)


def test_a_secret_on_some_ranks_only_is_refused():
    with Ranks(
        build_comm, 2, env_per_rank=lambda r: {"WEFT_JOB_SECRET": "s"} if r else {}
    ) as ranks:
        results = ranks.results(30)
    for r in results:
        assert r["raised"] == "InvalidArgument", results
        assert "WEFT_JOB_SECRET is set on rank 1 but not on rank 0" in r["message"]


@pytest.mark.parametrize(
    "env,words",
    [
        ({"WEFT_SOCKET_ADDR": "not-an-address"}, "is not an IPv4 address"),
        ({"WEFT_SOCKET_ADDR": "203.0.113.9"}, "no interface of this host has that address"),
        ({"WEFT_SOCKET_ADDR": "127.0.0.1", "WEFT_SOCKET_IFNAME": "lo"}, "set one"),
    ],
    ids=["malformed", "foreign", "both"],
)
def test_a_bad_listen_address_is_refused(env, words):
    with Ranks(build_comm, 1, env=env) as ranks:
        (result,) = ranks.results(30)
    assert result["raised"] == "InvalidArgument" and words in result["message"], result
