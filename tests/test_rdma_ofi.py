"""The ofi transport over libfabric's shm provider (FI_EP_RDM endpoints, where writes need not
land in order): the collectives at world sizes 2, 3 and 5 and the data movement (at 3) of
tests/test_rdma.py, which runs them over the tcp provider and the other back end. Skips, with
the reason, where the provider is missing."""

from __future__ import annotations

import pytest
from rdma_support import ofi_missing
from test_collectives import COLLECTIVES
from test_rdma import PATH_COUNTS, SOME_OPS, TWO_DTYPES, data_movement
from weft_ref import assert_no_mismatch

MISSING = ofi_missing("shm", "FI_EP_RDM")
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.mark.parametrize("size", [2, 3, 5])
@pytest.mark.parametrize("collective", list(COLLECTIVES))
def test_collective_over_shm_provider(pools, collective, size):
    pool = pools.get(size, "ofi-shm")
    assert_no_mismatch(pool.run(COLLECTIVES[collective], TWO_DTYPES, SOME_OPS, PATH_COUNTS))


def test_data_movement_over_shm_provider(pools):
    data_movement(pools.get(3, "ofi-shm"))
