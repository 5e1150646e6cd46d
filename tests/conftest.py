"""Session fixtures for the weft tests.

``pools.get(size, transport)`` returns a live pool of rank processes (see weft_pool.py); pools
are shared by every test of the session and killed at its end. Tests parametrized by ``size``
and ``transport`` are run grouped by those two, so each pool is started about once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # the helper modules, in any pytest import mode
    sys.path.insert(0, str(TESTS_DIR))

from weft_pool import TRANSPORTS, PoolRegistry  # noqa: E402


@pytest.fixture(scope="session")
def pools():
    registry = PoolRegistry(max_alive=3)
    try:
        yield registry
    finally:
        registry.close_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.weft_failed = report.failed
    return report


@pytest.fixture(autouse=True)
def _fresh_pools_after_failure(request):
    """A failed test may leave its ranks out of step: start the next test on fresh pools."""
    yield
    if getattr(request.node, "weft_failed", False) and "pools" in request.fixturenames:
        request.getfixturevalue("pools").close_all()


def _pool_key(item) -> tuple:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "size" in params and "transport" in params:
        return (1, params["size"], TRANSPORTS.index(params["transport"]))
    return (0, 0, 0)


def pytest_collection_modifyitems(session, config, items):
    """Within each module, runs the tests that use the same pool one after another."""
    file_order: dict[str, int] = {}
    for item in items:
        file_order.setdefault(str(item.path), len(file_order))
    items.sort(key=lambda item: (file_order[str(item.path)], _pool_key(item)))
