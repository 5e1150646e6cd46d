"""Whether the RDMA transports can run here, and why not: the tests skip with that reason."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def ofi_missing(provider: str = "tcp", endpoint: str = "FI_EP_MSG") -> str | None:
    """None when libfabric loads and offers ``provider`` endpoints of type ``endpoint`` with
    FI_RMA, else why not."""
    try:
        ctypes.CDLL("libfabric.so.1")
    except OSError as e:
        return f"libfabric is not installed ({e}); `make install-peers` installs it"
    if shutil.which("fi_info") is None:
        return "fi_info is missing (Debian: libfabric-bin); `make install-peers` installs it"
    probe = subprocess.run(
        ["fi_info", "-p", provider, "-t", endpoint, "-c", "FI_RMA"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        return f"libfabric's {provider} provider offers no {endpoint} endpoint with FI_RMA here"
    return None


VERBS_H = Path("/usr/include/infiniband/verbs.h")
EMULATOR_DIR = Path(__file__).resolve().parent / "verbs_emulator"


class VerbsEmulatorUnavailable(RuntimeError):
    """The verbs emulator cannot be built here; the message says why (tests skip with it)."""


def _build_cached(name: str, sources: list[Path], flags: list[str]) -> Path:
    """``name`` built with g++ from ``sources``, once per content of the sources, the emulator's
    header, verbs.h and the flags (cached under the temporary directory)."""
    if not VERBS_H.exists():
        raise VerbsEmulatorUnavailable(
            f"{VERBS_H} is missing (Debian: libibverbs-dev); `make install-peers` installs it"
        )
    if shutil.which("g++") is None:
        raise VerbsEmulatorUnavailable("g++ is missing: the verbs emulator cannot be built")
    digest = hashlib.sha256(" ".join(flags).encode())
    for path in [*sources, EMULATOR_DIR / "emu.h", VERBS_H]:
        digest.update(path.read_bytes())
    cache = Path(tempfile.gettempdir()) / "weft-verbs-emulator"
    cache.mkdir(exist_ok=True)
    out = cache / f"{digest.hexdigest()[:16]}-{name}"
    if not out.exists():
        tmp = cache / f"{out.name}.{os.getpid()}.tmp"
        cmd = ["g++", "-std=c++17", *map(str, sources), *flags, "-o", str(tmp)]
        built = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if built.returncode != 0:
            tmp.unlink(missing_ok=True)
            # A broken build fails the tests rather than skipping them.
            raise RuntimeError(f"building {name} failed:\n{built.stderr[-4000:]}")
        os.replace(tmp, out)
    return out


def verbs_emulator() -> Path:
    """The verbs emulator (tests/verbs_emulator/), built: a libibverbs stand-in that weft's
    ibverbs back end loads through ``WEFT_IBVERBS_LIB``. Raises VerbsEmulatorUnavailable with
    the reason when g++ or verbs.h is missing here (RuntimeError when the build fails)."""
    sources = sorted(EMULATOR_DIR.glob("emu_*.cc"))
    sources = [s for s in sources if s.name != "emu_selftest.cc"]
    flags = ["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread",
             "-fvisibility=hidden"]  # fmt: skip
    return _build_cached("libweft_verbs_emulator.so", sources, flags)


def verbs_emulator_selftest() -> Path:
    """The emulator's own test client (emu_selftest.cc), built."""
    return _build_cached(
        "emu_selftest", [EMULATOR_DIR / "emu_selftest.cc"], ["-O1", "-Wall", "-Wextra", "-ldl"]
    )
