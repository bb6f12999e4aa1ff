"""serve_app/gateway/unhealthy_pods.py: which waiting requests move, and when, against the
datastore's status rows (the end-to-end case, a frozen pod behind a real gateway, is in
test_reliability_e2e.py)."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.gateway.unhealthy_pods import PodLeft, UnhealthyPods


class Pool:
    """The datastore's `status()` rows, as the test sets them."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        self.asked = 0

    async def status(self) -> list[dict]:
        self.asked += 1
        return [{"name": name, "state": state} for name, state in self.states.items()]


async def wait_at(pods: UnhealthyPods, pod: str, release: asyncio.Event) -> str:
    try:
        with pods.waiting(pod):
            await release.wait()
        return "answered"
    except PodLeft as err:
        return f"moved: {err}"


@pytest.mark.parametrize(
    ("state_after_leaving", "outcome"),
    [
        ("unhealthy", "moved"),  # scrapes fail: hung, stopped, host gone
        ("stale", "answered"),  # only its metrics are old (a metrics actor restarting)
        ("draining", "answered"),  # scaled down: the EPP never cuts what a draining pod still serves
        (None, "answered"),  # removed from the pool: a working pod may still answer
    ],
)
def test_only_a_pod_the_datastore_calls_unhealthy_has_its_waiting_requests_moved(state_after_leaving, outcome):
    async def run() -> str:
        pool = Pool()
        pool.states = {"a": "ready", "b": "ready"}
        pods = UnhealthyPods(pool.status, poll_s=0.01)
        release = asyncio.Event()
        waiter = asyncio.create_task(wait_at(pods, "a", release))
        await asyncio.sleep(0)
        if state_after_leaving is None:
            del pool.states["a"]
        else:
            pool.states["a"] = state_after_leaving
        pods.view_changed(left={"a"}, back=set())
        await asyncio.sleep(0.1)
        release.set()
        return (await waiter).split(":")[0]

    assert asyncio.run(run()) == outcome


def test_a_pod_back_in_the_pool_is_not_asked_about_and_its_requests_stay():
    async def run() -> tuple[str, int]:
        pool = Pool()
        pool.states = {"a": "stale"}
        pods = UnhealthyPods(pool.status, poll_s=0.05)
        release = asyncio.Event()
        waiter = asyncio.create_task(wait_at(pods, "a", release))
        await asyncio.sleep(0)
        pods.view_changed(left={"a"}, back=set())
        await asyncio.sleep(0.01)
        pods.view_changed(left=set(), back={"a"})  # routable again
        pool.states["a"] = "unhealthy"  # what the watcher would see, had it asked again
        await asyncio.sleep(0.2)
        release.set()
        return await waiter, pool.asked

    answered, asked = asyncio.run(run())
    assert answered == "answered" and asked == 1


def test_a_client_cancelling_its_own_request_is_not_turned_into_a_move():
    async def run() -> bool:
        pods = UnhealthyPods(Pool().status)
        task = asyncio.create_task(wait_at(pods, "a", asyncio.Event()))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(run())


def test_a_pod_nobody_waits_at_is_never_asked_about():
    async def run() -> int:
        pool = Pool()
        pods = UnhealthyPods(pool.status, poll_s=0.01)
        pods.view_changed(left={"a", "b"}, back=set())
        await asyncio.sleep(0.05)
        return pool.asked

    assert asyncio.run(run()) == 0
