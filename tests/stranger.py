"""weft's bootstrap handshake written again in Python (csrc/core/bootstrap/handshake.h), for
tests that play a stranger on a rank's port: one that knows the protocol but not the secret, one
that sends garbage, or a man in the middle that records what real ranks send (Relay).
Independent of the C++: the MACs come from Python's hmac/hashlib."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading

HELLO_MAGIC = 0x57464833  # "WFH3"
CHALLENGE_MAGIC = 0x57464348  # "WFCH"
HELLO_BYTES = 48
CHALLENGE_BYTES = 68
PROOF_BYTES = 32
WELCOME = b"W"


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


def redirected(entry: bytes, port: int) -> bytes:
    """A rank's Store address entry (csrc/core/bootstrap/address.cc) naming ``port`` instead of
    its own: magic, size and pid (4 bytes each) come first, then the port (host order)."""
    from weft._C import wire

    out = entry[:12] + struct.pack("=H", port) + entry[14:]
    before = wire.decode_address(entry)  # (size, pid, port, host_id, ip)
    if before is None or wire.decode_address(out) != (*before[:2], port, *before[3:]):
        raise AssertionError("the Store's address entry is laid out differently now")
    return out


class Relay:
    """A man in the middle on loopback: listens on a port of its own (put in the Store in place
    of a rank's, so that the ranks connecting to that rank come here) and relays each connection
    to the rank's listener at ``target``, recording its handshake as it crossed, one dict per
    connection in ``handshakes``: hello, challenge, proof, welcome (what arrived of each) and
    upstream_port (the port the rank saw it come from). Bytes after the handshake are relayed
    unrecorded. The first connection whose hello ``cut`` picks is cut once its proof arrived
    (never delivered; ``was_cut`` is set); connections that come after wait for ``resume``."""

    def __init__(self, target: int, cut=lambda hello: False):
        self.target, self.cut = target, cut
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.1)
        self.port = self.server.getsockname()[1]
        self.handshakes: list[dict] = []
        self.was_cut = threading.Event()
        self.resume = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self):
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.resume.set()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in threads:
            t.join(10)
        self.server.close()

    def _spawn(self, target, *args):
        t = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:  # the 0.1 s timeout, or closed
                continue
            with self._lock:
                self._sockets.append(conn)
            self._spawn(self._relay, conn, self.was_cut.is_set())

    def _relay(self, conn: socket.socket, hold: bool):
        if hold:
            self.resume.wait(60)
        if self._stop.is_set():
            return
        try:
            up = socket.create_connection(("127.0.0.1", self.target), timeout=10)
        except OSError:
            conn.close()
            return
        with self._lock:
            self._sockets.append(up)
        record = {"upstream_port": up.getsockname()[1]}
        conn.settimeout(10)
        steps = [
            (conn, up, HELLO_BYTES, "hello"),
            (up, conn, CHALLENGE_BYTES, "challenge"),
            (conn, up, PROOF_BYTES, "proof"),
            (up, conn, len(WELCOME), "welcome"),
        ]
        try:
            for src, dst, n, name in steps:
                record[name] = data = recv_exactly(src, n)
                with self._lock:
                    cut = (
                        name == "proof" and not self.was_cut.is_set() and self.cut(record["hello"])
                    )
                    if cut or len(data) < n:
                        record["cut"] = cut
                        self.handshakes.append(record)
                        if cut:
                            self.was_cut.set()
                if cut or len(data) < n:
                    conn.close()
                    up.close()
                    return
                dst.sendall(data)
        except OSError:
            conn.close()
            up.close()
            return
        with self._lock:
            self.handshakes.append(record)
        conn.settimeout(None)
        up.settimeout(None)
        self._spawn(self._pump, up, conn)
        self._pump(conn, up)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket):
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
