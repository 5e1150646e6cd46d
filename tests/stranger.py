"""weft's bootstrap handshake written again in Python (csrc/core/bootstrap/handshake.h), for
tests that play a stranger on a rank's port: one that knows the protocol but not the secret, or
one that sends garbage. Independent of the C++: the MACs come from Python's hmac/hashlib."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct

HELLO_MAGIC = 0x57464833  # "WFH3"
CHALLENGE_MAGIC = 0x57464348  # "WFCH"
HELLO_BYTES = 48
CHALLENGE_BYTES = 68


def hello(sender: int, to: int, index: int, nonce: bytes) -> bytes:
    return struct.pack("<Iiii", HELLO_MAGIC, sender, to, index) + nonce


def mac(label: str, secret: bytes, prefix: str, size: int, sender: int, to: int, index: int,
        connect_nonce: bytes, accept_nonce: bytes) -> bytes:  # fmt: skip
    message = (
        label.encode() + b"\0"
        + struct.pack("<IIiii", len(prefix), size, sender, to, index)
        + prefix.encode() + connect_nonce + accept_nonce
    )  # fmt: skip
    return hmac.new(secret, message, hashlib.sha256).digest()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the other end closes (or resets) ``sock`` within ``timeout`` seconds."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def impostor(port: int, secret: bytes, prefix: str, size: int, sender: int, to: int) -> dict:
    """Plays rank ``sender`` knowing everything but the real secret (it uses ``secret``): sends a
    valid hello, reads the challenge, answers with the MAC its secret gives. Returns what it saw."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        nonce = os.urandom(32)
        s.sendall(hello(sender, to, 0, nonce))
        challenge = recv_exactly(s, CHALLENGE_BYTES)
        if len(challenge) < CHALLENGE_BYTES:
            return {"challenge": challenge, "closed": True}
        accept_nonce = challenge[4:36]
        args = (secret, prefix, size, sender, to, 0, nonce, accept_nonce)
        s.sendall(mac("weft connect", *args))
        return {"challenge": challenge, "nonce": nonce, "closed": closed_by_peer(s, 10)}
