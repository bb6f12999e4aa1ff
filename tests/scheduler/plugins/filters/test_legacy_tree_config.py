"""ray_epp/configs/legacy-filter-tree.yaml through Scheduler.from_config(load_config(text)) behaves as the
original GIE scheduler (pkg/epp/scheduling/scheduler.go and filter.go at a70d66e5): its TestFilter / TestSchedule
scenarios, hand-worked paths through every branch, and agreement with a direct transcription of
that Go filter tree on random pools."""

import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from scheduler import ErrorCode, Scheduler, SchedulingError, load_config
from tests.scheduler.helpers import endpoint, fresh_state, names, request

CONFIG = Path(__file__).resolve().parents[4] / "ray_epp" / "configs" / "legacy-filter-tree.yaml"
CRITICAL, STANDARD, SHEDDABLE = 1, 0, -1
AFFINITY, AVAILABLE = 0.5, 0.9995  # LoRA draws below / above the 0.999 threshold


def scheduler(lora_draw: float = AFFINITY, text: str | None = None) -> Scheduler:
    sched = Scheduler.from_config(load_config(text or CONFIG.read_text()))
    sched.plugins["lora-affinity"].rng = SimpleNamespace(random=lambda: lora_draw)
    return sched


def pod(name, q, kv, active=(), max_active=2):
    return endpoint(
        name, waiting_queue_size=q, kv_cache_usage_percent=kv, active_models=list(active), max_active_models=max_active
    )


# GIE's TestFilter (pkg/epp/scheduling/filter_test.go at a70d66e5) / TestSchedule (scheduler_test.go at 264ee45a) pools.
GIE_POOL = [
    pod("pod1", 0, 0.2, ["foo", "bar"]),
    pod("pod2", 3, 0.1, ["foo", "critical"]),
    pod("pod3", 10, 0.2, ["foo"]),
]
SATURATED_POOL = [
    pod("pod1", 10, 0.9, ["foo", "bar"]),
    pod("pod2", 3, 0.85, ["foo", "critical"]),
    pod("pod3", 10, 0.85, ["foo"]),
]
# Sheddable-friendly: three endpoints with capacity, two with the shortest queue, one holding "m".
SPARE_POOL = [
    pod("pod1", 0, 0.1, ["m"], 4),
    pod("pod2", 0, 0.2, [], 4),
    pod("pod3", 1, 0.15, ["m"], 4),
    pod("pod4", 9, 0.1, ["m"], 4),
]

SCENARIOS = [
    pytest.param(
        "critical", CRITICAL, GIE_POOL, AFFINITY, ["pod2"], id="GIE: critical request -> low queue, adapter, low KV"
    ),
    pytest.param(
        "critical", CRITICAL, GIE_POOL, AVAILABLE, ["pod3"], id="critical, the 0.1% draw: the pod with a free slot"
    ),
    pytest.param("sheddable", SHEDDABLE, GIE_POOL, AFFINITY, ["pod1"], id="GIE: sheddable request, accepted"),
    pytest.param(
        "m",
        CRITICAL,
        [pod("pod1", 200, 0.5, ["a"], 4), pod("pod2", 130, 0.1, [], 4), pod("pod3", 300, 0.0, ["m"], 4)],
        AFFINITY,
        ["pod2"],
        id="critical, every queue >= 128: least queue first (130 <= q <= 186), then LoRA, then KV",
    ),
    pytest.param(
        "m",
        CRITICAL,
        [pod("pod1", 1, 0.3, ["x", "y"]), pod("pod2", 2, 0.1, ["x", "z"]), pod("pod3", 0, 0.6, ["y", "z"])],
        AFFINITY,
        ["pod3"],
        id="critical, adapter nowhere and no free slot: LoRA fails, least queue then KV on its input",
    ),
    pytest.param(
        "m",
        SHEDDABLE,
        SPARE_POOL,
        AFFINITY,
        ["pod1"],
        id="sheddable with capacity: has capacity, least queue, adapter",
    ),
    pytest.param(
        "m",
        SHEDDABLE,
        SPARE_POOL,
        AVAILABLE,
        ["pod2"],
        id="sheddable with capacity, the 0.1% draw",
    ),
    pytest.param(
        "sheddable", STANDARD, SATURATED_POOL, AFFINITY, ["pod3"], id="standard is critical: served when saturated"
    ),
    pytest.param(
        "m",
        CRITICAL,
        [pod("pod1", 0, 0.2, ["m"], 4), pod("pod2", 0, 0.2, ["m"], 4), pod("pod3", 0, 0.2, ["m"], 4)],
        AFFINITY,
        ["pod1", "pod2", "pod3"],
        id="equal pods: all survive for the random pick",
    ),
]


@pytest.mark.parametrize(("model", "priority", "pods", "draw", "want"), SCENARIOS)
def test_tree_scenarios(model, priority, pods, draw, want):
    sched = scheduler(draw)
    req = request(model=model, priority=priority)
    kept = sched.plugins["legacy-filter-tree"].filter(fresh_state(), req, pods)
    assert names(kept) == want
    result = sched.schedule(req, pods)
    assert result.primary_profile_name == "default"
    assert result.target.name in want
    assert len(result.primary.target_endpoints) == 1


@pytest.mark.parametrize(
    ("priority", "text"),
    [
        pytest.param(SHEDDABLE, None, id="GIE: sheddable request, dropped"),
        pytest.param(
            STANDARD,
            CONFIG.read_text().replace(
                "- name: critical-request\n  type: critical-request-filter\n",
                "- name: critical-request\n  type: critical-request-filter\n  parameters: {minPriority: 1}\n",
            ),
            id="minPriority 1 (the Go tree's strict reading): standard is dropped too",
        ),
    ],
)
def test_sheddable_dropped_when_saturated(priority, text):
    sched = scheduler(text=text)
    with pytest.raises(SchedulingError) as info:
        sched.schedule(request(model="sheddable", priority=priority), SATURATED_POOL)
    err = info.value
    assert err.code is ErrorCode.RESOURCE_EXHAUSTED
    assert err.http_status == 429
    assert err.message == "dropping request due to limited backend resources"


def test_minpriority_override_really_applies():
    text = CONFIG.read_text().replace(
        "- name: critical-request\n  type: critical-request-filter\n",
        "- name: critical-request\n  type: critical-request-filter\n  parameters: {minPriority: 1}\n",
    )
    assert scheduler(text=text).plugins["critical-request"].params.min_priority == 1


def test_final_pick_is_uniform_over_the_tree_output():
    sched = scheduler()
    sched.plugins["random-picker"].rng.seed(99)
    pods = [pod(f"pod{i}", 0, 0.2, ["m"], 4) for i in (1, 2, 3)] + [pod("busy", 50, 0.9, ["m"], 4)]
    counts = Counter(sched.schedule(request(model="m", priority=CRITICAL), pods).target.name for _ in range(6000))
    assert set(counts) == {"pod1", "pod2", "pod3"}
    for n in counts.values():
        assert abs(n / 6000 - 1 / 3) < 0.03


# --- agreement with the Go filter tree on random pools ------------------------------------------
# A transcription of GIE's scheduler.go / filter.go at a70d66e5 as plain functions over (name, q, kv,
# adapters, max) tuples, written independently of the plugins.


def _go_band(pods, key, integral):
    if not pods:
        return []
    lo, hi = min(key(p) for p in pods), max([0, *(key(p) for p in pods)])
    top = lo + ((hi - lo) // len(pods) if integral else (hi - lo) / len(pods))
    return [p for p in pods if lo <= key(p) <= top]


def _go_lora(model, draw):
    def f(pods):
        aff = [p for p in pods if model in p[3]]
        avail = [p for p in pods if model not in p[3] and len(p[3]) < p[4]]
        if aff and avail:
            return aff if draw < 0.999 else avail
        return aff or avail

    return f


def _go_node(f, ok=None, fail=None, either=None):
    def run(pods):
        out = f(pods)
        nxt = (ok or either) if out else (fail or either)
        if nxt is None:
            return out
        return nxt(out if out else pods)

    return run


def go_filter(critical, model, pods, draw):
    least_q = lambda ps: _go_band(ps, lambda p: p[1], True)  # noqa: E731
    least_kv = lambda ps: _go_band(ps, lambda p: p[2], False)  # noqa: E731
    lora = _go_lora(model, draw)
    queue_kv = _go_node(least_q, either=_go_node(least_kv))
    queue_lora_kv = _go_node(least_q, either=_go_node(lora, either=_go_node(least_kv)))
    low_latency = _go_node(
        lambda ps: [p for p in ps if p[1] < 128], ok=_go_node(lora, either=queue_kv), fail=queue_lora_kv
    )
    sheddable = _go_node(lambda ps: [p for p in ps if p[1] <= 5 and p[2] <= 0.8], ok=queue_lora_kv, fail=lambda ps: [])
    return _go_node(lambda ps: ps if critical else [], ok=low_latency, fail=sheddable)(pods)


def test_agrees_with_the_go_filter_tree_on_random_pools():
    rng = random.Random(2024)
    models = ["base", "a", "b", "c"]
    schedulers = {draw: scheduler(draw) for draw in (AFFINITY, AVAILABLE)}
    checked = dropped = 0
    for _ in range(1500):
        raw = []
        for i in range(rng.randint(1, 6)):
            adapters = rng.sample(models[1:], rng.randint(0, 3))
            q = rng.choice([0, 1, 3, 5, 6, 20, 127, 128, 200])
            kv = rng.choice([0.0, 0.1, 0.3, 0.79, 0.8, 0.81, 0.95])
            raw.append((f"pod{i}", q, kv, adapters, rng.choice([0, 1, 2, 3])))
        model = rng.choice(models)
        priority = rng.choice([CRITICAL, SHEDDABLE])
        draw = rng.choice([AFFINITY, AVAILABLE])
        pods = [pod(n, q, kv, adapters, mx) for n, q, kv, adapters, mx in raw]
        sched = schedulers[draw]
        want = [p[0] for p in go_filter(priority == CRITICAL, model, raw, draw)]
        assert (
            names(sched.plugins["legacy-filter-tree"].filter(fresh_state(), request(model, priority=priority), pods))
            == want
        )
        if want:
            assert sched.schedule(request(model, priority=priority), pods).target.name in want
        else:
            dropped += 1
            with pytest.raises(SchedulingError) as info:
                sched.schedule(request(model, priority=priority), pods)
            assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
        checked += 1
    assert checked == 1500 and 0 < dropped < checked  # both outcomes were exercised
