"""Small builders for scheduler tests: endpoints from compact tuples, requests, a cycle state."""

from __future__ import annotations

from scheduler import CycleState, Endpoint, LLMRequest, Metrics


def endpoint(name: str, labels: dict[str, str] | None = None, **metrics) -> Endpoint:
    """An endpoint with the given Metrics fields, e.g. endpoint("pod1", waiting_queue_size=3)
    (model lists are given as lists: Metrics takes any iterable of names)."""
    return Endpoint(name=name, labels=labels or {}, metrics=Metrics(**metrics))


def request(
    model: str = "base",
    prompt: str = "hello",
    request_id: str = "r1",
    priority: int = 0,
    headers: dict[str, str] | None = None,
) -> LLMRequest:
    return LLMRequest(
        request_id=request_id,
        target_model=model,
        body={"model": model, "prompt": prompt},
        headers=headers or {},
        priority=priority,
    )


def names(endpoints) -> list[str]:
    return [e.name for e in endpoints]


def fresh_state() -> CycleState:
    return CycleState()


class FakeClock:
    """A clock tests move by hand: `clock.now += 30`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def as_in_profile(sched, plugin, req: LLMRequest, endpoints: list[Endpoint], state: CycleState | None = None):
    """`plugin`'s filter or score for `req`, after the producers of the scheduler's default
    profile wrote their keys, as `SchedulerProfile.run` calls them."""
    state = state if state is not None else CycleState()
    for producer in sched.profiles["default"].producers:
        producer.produce(state, req, endpoints)
    call = plugin.filter if hasattr(plugin, "filter") else plugin.score
    return call(state, req, endpoints)
