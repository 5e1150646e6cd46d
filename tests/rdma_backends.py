"""The back ends the tests run weft's RDMA protocol over: ``ofi`` (libfabric's tcp provider)
and ``ibverbs`` (weft's verbs code over the verbs emulator of tests/verbs_emulator/), each with
the reason it cannot run here, the environment of a rank that uses it, and its rank pools
(tests/weft_pool.py)."""

from __future__ import annotations

import functools

import pytest
from rdma_support import VerbsEmulatorUnavailable, ofi_missing, verbs_emulator

BACKENDS = ("ofi", "ibverbs")
# The rank pools of each back end: default slots, and four 4 KiB slots.
POOLS = {"ofi": ("ofi-tcp", "ofi-tcp-small"), "ibverbs": ("ibverbs", "ibverbs-small")}


@functools.cache
def missing(backend: str) -> str | None:
    """None when ``backend`` can run here, else why not."""
    if backend == "ofi":
        return ofi_missing("tcp")
    try:
        verbs_emulator()
    except VerbsEmulatorUnavailable as e:
        return str(e)
    except RuntimeError:
        return None  # a broken build: the tests fail when they ask for the emulator
    return None


def env(backend: str) -> dict[str, str]:
    """What a rank needs in its environment to use ``backend``."""
    if backend == "ofi":
        return {"WEFT_TRANSPORT": "ofi", "FI_PROVIDER": "tcp"}
    return {"WEFT_TRANSPORT": "ibverbs", "WEFT_IBVERBS_LIB": str(verbs_emulator())}


def param(backend: str, *values, id: str):  # noqa: A002 - pytest's name
    """A pytest.param of ``values`` that skips, with the reason, where ``backend`` cannot run."""
    reason = missing(backend)
    return pytest.param(
        *values, id=id, marks=pytest.mark.skipif(reason is not None, reason=reason or "")
    )
