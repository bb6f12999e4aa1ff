"""Shared fixtures. `ray_session` starts one local Ray for the whole test session, and only when a
test asks for it (starting Ray costs ~10 s here)."""

from __future__ import annotations

import os

import pytest

RAY_TEST_NAMESPACE = "ray-epp-tests"
# The gateway tests' replicas serve this port (serve_app/gateway/ingress.py); Serve's proxy at +88.
GATEWAY_TEST_PORT = int(os.environ.get("EPP_TEST_PORT", "18400"))  # several checkouts may test at once
# Every plugin built from a config in a test, in process or in an actor (Ray's processes inherit
# this), sees only the body fields it declares (scheduler/body_fields.py): an undeclared read fails.
os.environ.setdefault("RAY_EPP_CHECK_BODY_READS", "1")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray (2 CPUs, no dashboard, 127.0.0.1), started once per session, shut down at the end.

    Workers import project modules (and test-only plugins under tests/) because Ray puts the
    driver's working directory on their sys.path: run pytest from the repository root."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from serve_app.cli.launch import serve_fast_path_env

    serve_fast_path_env()  # before Ray starts: Serve's processes inherit it
    import ray

    started = False
    if not ray.is_initialized():
        ray.init(
            address="local",  # never another `ray start` cluster of this machine (ray_current_cluster)
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            namespace=RAY_TEST_NAMESPACE,
            _node_ip_address="127.0.0.1",
        )
        started = True
    yield ray
    if started:
        ray.shutdown()


MULTINODE_DIR = os.path.join(os.path.dirname(__file__), "multinode")


# The test that runs after the one being torn down (None after the last): module fixtures look at it
# to keep what the next module shares (tests/serve_app/conftest.py).
NEXT_ITEM = pytest.StashKey[object]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    item.session.stash[NEXT_ITEM] = nextitem


def pytest_collection_modifyitems(session, config, items):
    """The multi-node tests (tests/multinode/) run last: they shut the session Ray down and start a
    `ray.cluster_utils.Cluster` of their own, so no test that uses `ray_session` may follow them.
    Modules that declare equal `E2E_SETUP`s (tests/serve_app/deployments.py) run one after the
    other, where the first of them would, so that they share one deployment; a test that spends it
    (it stops pods or a replica: marked `spends_e2e_setup(n)`, or every test of a module that
    declares `E2E_SETUP_SPENT`, n = 1) runs after the group's other tests, even those of later
    modules, and after those that spend less (a lower n)."""
    setups: list = []  # the first item's position of each distinct setup
    group: dict[int, int] = {}
    for i, item in enumerate(items):
        setup = getattr(getattr(item, "module", None), "E2E_SETUP", None)
        if setup is not None:
            first = next((pos for s, pos in setups if s == setup), None)
            if first is None:
                setups.append((setup, i))
            group[i] = i if first is None else first
    def key(i: int, item) -> tuple:
        spends = item.get_closest_marker("spends_e2e_setup")
        module = getattr(item, "module", None)
        spent = (spends.args or (1,))[0] if spends else int(getattr(module, "E2E_SETUP_SPENT", False))
        return str(item.path).startswith(MULTINODE_DIR), group.get(i, i), spent, i

    order = {id(item): key(i, item) for i, item in enumerate(items)}
    items.sort(key=lambda item: order[id(item)])
