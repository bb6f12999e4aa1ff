"""A plugin sees the same request in process and in a profile actor: one config, one request (a body
with fields no plugin reads, headers, a priority, an excluded endpoint), scheduled once by the
in-process Scheduler and once as the gateway schedules it (the handler here, the profile in its
real actor, the PreRequest as the event the gateway sends). `test-request-view-recorder` writes
what it saw onto the endpoints and keeps what its PreRequest saw: the two paths must agree on
both. A plugin that reads a field it did not declare fails on both paths, naming the field
(the suite runs with RAY_EPP_CHECK_BODY_READS=1, tests/conftest.py)."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")

from actors import ActorOptions  # noqa: E402
from actors.launcher import start_router_profile_actors, stop_router_profile_actors  # noqa: E402
from scheduler import CycleState, Endpoint, LLMRequest, Scheduler, build_plugins, load_config  # noqa: E402
from scheduler.body_fields import UndeclaredBodyField, checking_body_reads  # noqa: E402
from scheduler.cycle_state import profile_error_key  # noqa: E402
from scheduler.loop import schedule_cycles  # noqa: E402
from serve_app.gateway.ray_runner import RayProfileRunner  # noqa: E402
from tests.actors.plugins_for_tests import REQUEST_VIEW_KEY, RequestViewRecorder  # noqa: E402
from tests.conftest import RAY_TEST_NAMESPACE  # noqa: E402

RECORDER = RequestViewRecorder.type_name
CONFIG = f"""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: {RECORDER}
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: {RECORDER}
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"""
UNDECLARED = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: test-undeclared-body-reader
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: test-undeclared-body-reader
  - pluginRef: max-score-picker
"""
OPTIONS = ActorOptions(push_plugin_metrics=False, plugin_modules=["tests.actors.plugins_for_tests"])
ENDPOINTS = [Endpoint("pod-a", port=8001), Endpoint("pod-b", port=8002), Endpoint("pod-c", port=8003)]


def request() -> LLMRequest:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "what is in the document?"}],
        "cache_salt": "tenant-1",
        "temperature": 0.25,
        "user": "u-7",
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "max_tokens": 9,
    }
    headers = {"x-request-id": "view-1", "x-tenant": "t1"}
    return LLMRequest("view-1", "m", body, headers, priority=2, excluded_endpoints=frozenset({"pod-c"}))


def started(cfg) -> dict:
    """The config's profile actors, once each answers (they start while the machine is busy)."""
    actors = start_router_profile_actors(cfg, namespace=RAY_TEST_NAMESPACE, options=OPTIONS)
    ray.get([a.info.remote() for a in actors.values()], timeout=120)
    return actors


def recorder_hook_views(actor) -> list:
    def read(self) -> list:  # runs in the actor
        return next(p.hook_views for p in self.profile.plugins() if p.type_name == RECORDER)

    return ray.get(actor.__ray_call__.remote(read), timeout=30)


async def through_actors(cfg, actors: dict, req: LLMRequest) -> tuple[dict, list]:
    """As the gateway schedules: the loop and handler here, the profile in its actor, then the
    PreRequest event; returns the recorder's view from the result and its PreRequest's views."""
    built = build_plugins(cfg)
    runner = RayProfileRunner(actors, built.body_fields, call_timeout_s=60)
    result = await schedule_cycles(built.handler, {n: n for n in actors}, runner, req, ENDPOINTS, CycleState())
    runner.pre_request(req, result)
    await asyncio.sleep(0.1)  # the event leaves on its own (notify_delay_s)
    await actors["default"].info.remote()  # behind the event: it has been applied
    return result.target.attributes[REQUEST_VIEW_KEY], recorder_hook_views(actors["default"])


def test_a_plugin_sees_the_same_request_in_process_and_in_a_profile_actor(ray_session):
    assert checking_body_reads(), "tests/conftest.py sets RAY_EPP_CHECK_BODY_READS=1"
    cfg = load_config(CONFIG)
    assert build_plugins(cfg).body_fields == {"temperature", "user", "prompt", "messages", "cache_salt"}

    req = request()  # one request down both paths
    in_process = Scheduler.from_config(cfg)
    result = in_process.schedule(req, ENDPOINTS)
    local_view = result.target.attributes[REQUEST_VIEW_KEY]
    local_hooks = in_process.plugins[RECORDER].hook_views

    try:
        remote_view, remote_hooks = asyncio.run(through_actors(cfg, started(cfg), req))
    finally:
        stop_router_profile_actors(cfg, namespace=RAY_TEST_NAMESPACE)

    # What the recorder may read, and nothing of the rest of the body (tools, max_tokens, model).
    assert local_view["body"] == {"temperature": 0.25, "user": "u-7"}
    assert local_view["headers"] == {"x-request-id": "view-1", "x-tenant": "t1"}
    assert (local_view["priority"], local_view["excluded_endpoints"]) == (2, ["pod-c"])
    assert remote_view == local_view
    assert remote_hooks == local_hooks == [local_view]  # PreRequest: the event's copy, the same view


def test_a_plugin_that_reads_an_undeclared_field_fails_on_both_paths(ray_session):
    cfg = load_config(UNDECLARED)
    assert build_plugins(cfg).body_fields == {"temperature"}  # `user` would never reach an actor
    with pytest.raises(UndeclaredBodyField, match="'user' without declaring it"):
        Scheduler.from_config(cfg).schedule(request(), ENDPOINTS)

    async def run(actors: dict) -> str:
        runner = RayProfileRunner(actors, build_plugins(cfg).body_fields, call_timeout_s=60)
        state = CycleState()
        results = await runner(["default"], request(), state, ENDPOINTS, None)
        assert results == {"default": None}
        return state.read(profile_error_key("default")).message

    try:
        message = asyncio.run(run(started(cfg)))
    finally:
        stop_router_profile_actors(cfg, namespace=RAY_TEST_NAMESPACE)
    assert "UndeclaredBodyField" in message and "'user' without declaring it" in message, message
