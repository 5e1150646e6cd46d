"""What the JSON records about the machine and the software a run measured."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
from pathlib import Path


def read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def command_output(*cmd: str) -> str:
    try:
        run = subprocess.run(cmd, check=False, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return run.stdout.decode(errors="replace").strip()


def version_of(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(mpirun: str) -> dict:
    first_cpu = read_text("/proc/cpuinfo").split("\n\n")[0]
    cpu = dict(re.findall(r"^([^\t:]+?)\s*:\s*(.*)$", first_cpu, re.MULTILINE))
    mem_kib = re.search(r"^MemTotal:\s*(\d+) kB", read_text("/proc/meminfo"), re.MULTILINE)
    mpi = command_output(mpirun, "--version").splitlines()
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "date": now.isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu_model": cpu.get("model name") or platform.processor(),
        "cores": os.cpu_count(),
        "memory_gib": round(int(mem_kib.group(1)) / 2**20, 1) if mem_kib else None,
        "virtualized": "hypervisor" in cpu.get("flags", "").split(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": version_of("torch"),
        "weft": version_of("weft"),
        "weft_commit": command_output("git", "describe", "--always", "--dirty") or None,
        "mpi4py": version_of("mpi4py"),
        "mpirun": mpi[0] if mpi else None,
        "load_average": float((read_text("/proc/loadavg").split() or ["0"])[0]),
    }
