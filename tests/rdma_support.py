"""Whether the RDMA transports can run here, and why not: the tests skip with that reason."""

from __future__ import annotations

import ctypes
import shutil
import subprocess


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
