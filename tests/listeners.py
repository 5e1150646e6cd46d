"""The TCP sockets a process listens on, read from /proc (Linux): which ports weft opened and on
which address, for tests that attack them or check that they are gone."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

LISTEN = "0A"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed while we looked
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def listening(pid: int) -> list[tuple[str, int]]:
    """(ip, port) of every IPv4 and IPv6 TCP socket that process ``pid`` has in LISTEN state."""
    mine = _socket_inodes(pid)
    found = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != LISTEN or inode not in mine:
                continue
            addr_hex, port_hex = local.split(":")
            if table == "tcp":
                ip = socket.inet_ntoa(struct.pack("<I", int(addr_hex, 16)))
            else:
                raw = bytes.fromhex(addr_hex)
                ip = socket.inet_ntop(
                    socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                )
            found.append((ip, int(port_hex, 16)))
    return found
