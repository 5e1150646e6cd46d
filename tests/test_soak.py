"""A short soak (bench/soak.py, whose full run of 20 000 operations is committed under
bench/results/): mixed collectives, dtypes, sizes up to 4 MiB, subgroups, asynchronous and
blocking calls on 4 ranks, with zero wrong elements against numpy, the same bytes on every
rank, and no growth of fds or threads (RSS within the script's bound) in the second half."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import soak  # noqa: E402


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_short_soak(transport):
    results, summary, _ = soak.run(ops=300, size=4, transport=transport, every=50)
    assert summary["checked_elements"] > 0
    assert summary["wrong_elements"] == 0, summary["first_wrong"]
    assert summary["checksum_disagreements"] == 0, summary
    assert soak.within_bounds(summary), summary["growth_after_warm"]
