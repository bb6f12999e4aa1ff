"""Fixtures the gateway tests share. A module that declares `E2E_SETUP` (deployments.E2ESetup)
gets its simulated pods as `sim` and its EppDeployment as `gateway`; consecutive modules with equal
setups share them, and they are stopped after the last of those modules. `client` is an HTTP client
of the gateway, fresh for each test."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import NEXT_ITEM
from tests.serve_app.deployments import SharedE2E

SHARED = SharedE2E()


@pytest.fixture(scope="module")
def e2e(request, ray_session) -> SharedE2E:
    return SHARED.start(request.module.E2E_SETUP)


@pytest.fixture(scope="module")
def sim(e2e):
    return e2e.sim


@pytest.fixture(scope="module")
def gateway(e2e):
    return e2e.deployment


@pytest.fixture(scope="module", autouse=True)
def _shared_e2e_until_a_module_wants_another(request):
    """Stops the shared setup after a module unless the next module declares the same one (and
    this one did not spend it: `E2E_SETUP_SPENT`, it stops pods): no deployment of a finished module
    runs (and takes CPU or the port) under an unrelated module."""
    yield
    upcoming = getattr(request.session.stash.get(NEXT_ITEM, None), "module", None)
    spent = getattr(request.module, "E2E_SETUP_SPENT", False)
    if spent or SHARED.setup is None or getattr(upcoming, "E2E_SETUP", None) != SHARED.setup:
        SHARED.stop()


@pytest.fixture()
def client(gateway):
    with httpx.Client(base_url=gateway.url, timeout=60) as c:
        yield c
