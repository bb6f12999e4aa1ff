"""lora-residency-scorer: the resident set estimated from the metrics and from this scheduler's own
decisions (table-driven, with a fake clock), the spread rule, parameters, and the scheduler path."""

import pytest
from pydantic import ValidationError

from scheduler import PreRequest, ProfileRunResult, Scheduler, SchedulingResult, ScorerCategory
from scheduler.plugins.scorers.lora_affinity import LoraAffinityScorer
from scheduler.plugins.scorers.lora_residency import LoraResidencyParameters, LoraResidencyScorer
from scheduler.registry import plugin_class
from tests.scheduler.helpers import endpoint, fresh_state, request

NOW = 1000.0
SCRAPED = NOW - 0.05  # the metrics' update_time in the cases that set one


class FakeClock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def scorer(**params) -> LoraResidencyScorer:
    s = LoraResidencyScorer(params=LoraResidencyParameters(**params))
    s.clock = FakeClock()
    return s


def pod(name, active=(), waiting=(), max_active=4, update_time=0.0, **extra):
    return endpoint(
        name,
        active_models=list(active),
        waiting_models=list(waiting),
        max_active_models=max_active,
        update_time=update_time,
        **extra,
    )


def result_for(**profile_targets) -> SchedulingResult:
    results = {p: ProfileRunResult([ep]) for p, ep in profile_targets.items()}
    return SchedulingResult(results, primary_profile_name=next(iter(results)))


def send(s: LoraResidencyScorer, pod_name: str, model: str, at: float, request_id: str = "r") -> None:
    s.clock.now = at
    s.pre_request(request(model=model, request_id=request_id), result_for(default=endpoint(pod_name)))


def learn(s: LoraResidencyScorer, *adapters: str) -> None:
    """Let the scorer see the adapters reported by some endpoint (as a scrape would show them)."""
    s.score(fresh_state(), request(), [pod("elsewhere", active=adapters, max_active=len(adapters))])


def score_names(s, model, pods) -> dict[str, float]:
    return {ep.name: v for ep, v in s.score(fresh_state(), request(model=model), pods).items()}


# Spread off (a free slot scores 0.8 either way): these cases are about the resident set only.
RESIDENCY_CASES = [
    pytest.param(
        [],
        [pod("has-it", ["lora-1"]), pod("room", ["x"]), pod("full", ["a", "b", "c", "d"])],
        {"has-it": 1.0, "room": 0.8, "full": 0.0},
        id="no memory: the metrics alone (running adapter, free slot, full)",
    ),
    pytest.param(
        [],
        [pod("loading", ["a", "b", "c"], waiting=["lora-1"]), pod("full", ["a", "b", "c"], waiting=["d"])],
        {"loading": 1.0, "full": 0.0},
        id="a waiting adapter is resident, and takes a slot",
    ),
    pytest.param(
        [("idle", "lora-1", NOW - 5)],
        [pod("idle", ["x"]), pod("room", ["y"])],
        {"idle": 1.0, "room": 0.8},
        id="sent there 5 s ago, idle now: still resident",
    ),
    pytest.param(
        [("idle", "lora-1", NOW - 601)],
        [pod("idle", ["x"]), pod("room", ["y"])],
        {"idle": 0.8, "room": 0.8},
        id="sent there longer ago than the window: forgotten",
    ),
    pytest.param(
        [("p", m, NOW - 10 + i) for i, m in enumerate(["lora-1", "a", "b", "c", "d"])],
        [pod("p")],
        {"p": 0.0},
        id="four adapters sent there since: the least recent is evicted",
    ),
    pytest.param(
        [("p", m, NOW - 10 + i) for i, m in enumerate(["a", "lora-1", "b", "c", "d"])] + [("p", "lora-1", NOW - 1)],
        [pod("p")],
        {"p": 1.0},
        id="sent again since: it is the most recent, another adapter is evicted",
    ),
    pytest.param(
        [("p", "lora-1", NOW - 10), ("p", "base", NOW - 1), ("q", "base", NOW - 1)],
        [pod("p", ["a", "b", "c"]), pod("q", ["a", "b", "c"])],
        {"p": 1.0, "q": 0.8},
        id="the base model (never reported) takes no slot",
    ),
    pytest.param(
        [("p", "lora-1", NOW - 1)],
        [pod("p", ["a", "b", "c", "d"], update_time=SCRAPED)],
        {"p": 0.0},
        id="sent before the scrape, which shows four others running: evicted",
    ),
    pytest.param(
        [("p", "lora-1", NOW - 0.01)],
        [pod("p", ["a", "b", "c", "d"], update_time=SCRAPED)],
        {"p": 1.0},
        id="sent after the scrape: there (or waiting for a slot) though the metrics can not show it",
    ),
    pytest.param(
        [("p", "lora-1", NOW - 0.01)],
        [pod("p", ["a", "b", "c", "d"], reported_at=SCRAPED)],
        {"p": 1.0},
        id="the same as a datastore snapshot serves it (update_time 0, the report's time kept aside)",
    ),
    pytest.param(
        [("p", "a", NOW - 3), ("p", "b", NOW - 2)],
        [pod("p", ["c", "d"], update_time=SCRAPED), pod("q", ["c", "d"], update_time=SCRAPED)],
        {"p": 0.0, "q": 0.8},
        id="remembered adapters fill the slots the metrics leave",
    ),
    pytest.param(
        [("q", "lora-1", NOW - 1)],
        [pod("p", ["lora-1"], max_active=0), pod("q", max_active=0)],
        {"p": 1.0, "q": 0.0},
        id="no slots reported (max_active_models 0): only what the metrics list",
    ),
]


@pytest.mark.parametrize(("sent", "pods", "expected"), RESIDENCY_CASES)
def test_resident_set(sent, pods, expected):
    s = scorer(spareSlotScore=0.8)
    learn(s, "lora-1", "a", "b", "c", "d", "x", "y")
    for i, (name, model, at) in enumerate(sent):
        send(s, name, model, at, request_id=f"r{i}")
    s.clock.now = NOW
    assert score_names(s, "lora-1", pods) == pytest.approx(expected)


def test_idle_adapter_gie_scorer_would_send_elsewhere():
    """The case this scorer exists for: GIE's lora-affinity-scorer can not tell the idle server."""
    pods = [pod("idle", ["x"]), pod("room", ["y"])]
    gie = {ep.name: v for ep, v in LoraAffinityScorer().score(fresh_state(), request(model="lora-1"), pods).items()}
    assert gie == {"idle": 0.8, "room": 0.8}
    s = scorer()
    learn(s, "lora-1")
    send(s, "idle", "lora-1", NOW - 30)
    s.clock.now = NOW
    assert score_names(s, "lora-1", pods) == {"idle": 1.0, "room": 0.8}  # all its traffic on 1 of 2: spread
    assert s.resident(pods[0]) == ["x", "lora-1"]


def test_unknown_model_gets_no_affinity_until_reported():
    s = scorer()
    send(s, "p", "new", NOW - 1)
    s.clock.now = NOW
    pods = [pod("p", ["x"]), pod("q", ["y"])]
    assert score_names(s, "new", pods) == {"p": 0.8, "q": 0.8}
    learn(s, "new")  # a scrape showed it running somewhere: now the memory counts
    assert score_names(s, "new", pods) == {"p": 1.0, "q": 0.8}


# (share of recent requests for lora-1, candidates holding it, candidates) -> free-slot score.
# Wanted endpoints = ceil(spread 1.5 * share * candidates); below that a free slot scores 0.8.
SPREAD_CASES = [
    pytest.param(0.5, 1, 4, 0.8, id="half the traffic on 1 of 4: wants 3, free slot open"),
    pytest.param(0.5, 2, 4, 0.8, id="half the traffic on 2 of 4: still wants 3"),
    pytest.param(0.5, 3, 4, 0.5, id="half the traffic on 3 of 4: enough, spare slot"),
    pytest.param(0.1, 1, 4, 0.5, id="a tenth of the traffic on 1 of 4: enough"),
    pytest.param(0.25, 1, 8, 0.8, id="a quarter of the traffic on 1 of 8: wants 3"),
]


@pytest.mark.parametrize(("share", "holding", "candidates", "free"), SPREAD_CASES)
def test_spread(share, holding, candidates, free):
    s = scorer(popularityHalfLife="1h")
    learn(s, "lora-1", "other")
    n = 20
    for i in range(n):  # all sent at NOW - 1: the shares are exact
        model = "lora-1" if i < share * n else "other"
        send(s, "elsewhere", model, NOW - 1, request_id=f"r{i}")
    s.clock.now = NOW
    assert s.share("lora-1") == pytest.approx(share)
    pods = [pod(f"h{i}", ["lora-1"]) for i in range(holding)]
    pods += [pod(f"f{i}", ["x"]) for i in range(candidates - holding)]
    expected = {p.name: 1.0 for p in pods[:holding]} | {p.name: free for p in pods[holding:]}
    assert score_names(s, "lora-1", pods) == pytest.approx(expected)


def test_spread_nowhere_resident_opens_a_free_slot_whatever_its_share():
    s = scorer()
    learn(s, "lora-1")
    s.clock.now = NOW
    assert score_names(s, "lora-1", [pod("p", ["x"]), pod("q", ["a", "b", "c", "d"])]) == {"p": 0.8, "q": 0.0}


def test_popularity_fades_with_half_life():
    s = scorer(popularityHalfLife="10s")
    send(s, "p", "old", NOW - 20, request_id="1")  # two half-lives ago: weighs 1/4
    send(s, "p", "new", NOW, request_id="2")
    assert s.share("new") == pytest.approx(1 / 1.25)
    assert s.share("old") == pytest.approx(0.25 / 1.25)
    assert s.share("never") == 0.0


def test_pre_request_learns_the_first_target_of_every_profile():
    s = scorer(spareSlotScore=0.8)
    learn(s, "lora-1")
    s.clock.now = NOW
    failed = SchedulingResult(
        {"decode": ProfileRunResult([pod("d"), pod("x")]), "prefill": ProfileRunResult([pod("p")]), "z": None},
        "decode",
    )
    s.pre_request(request(model="lora-1"), failed)
    pods = [pod("d"), pod("p"), pod("x")]
    assert score_names(s, "lora-1", pods) == {"d": 1.0, "p": 1.0, "x": 0.8}


@pytest.mark.parametrize(
    "params",
    [
        {"window": "0s"},
        {"window": "soon"},
        {"window": 30},
        {"popularityHalfLife": "-1s"},
        {"spread": 0},
        {"freeSlotScore": 1.5},
        {"spareSlotScore": -0.1},
        {"freeSlotScore": 0.4, "spareSlotScore": 0.5},
        {"residentScore": 1.0},
    ],
)
def test_invalid_parameters_are_rejected(params):
    with pytest.raises(ValidationError):
        LoraResidencyParameters.model_validate(params)


def test_defaults_and_go_durations():
    p = LoraResidencyParameters()
    assert (p.window, p.popularity_half_life, p.spread, p.free_slot_score, p.spare_slot_score) == (
        600.0,
        30.0,
        1.5,
        0.8,
        0.5,
    )
    assert LoraResidencyParameters.model_validate({"window": "1m30s"}).window == 90.0


def test_type_name_and_roles():
    s = LoraResidencyScorer()
    assert s.name == s.type_name == "lora-residency-scorer"
    assert plugin_class("lora-residency-scorer") is LoraResidencyScorer
    assert isinstance(s, PreRequest)
    assert s.category is ScorerCategory.AFFINITY


def test_through_the_scheduler_an_idle_adapter_keeps_its_server():
    sched = Scheduler.from_config(
        """
plugins:
- type: lora-residency-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: lora-residency-scorer, weight: 10}
  - {pluginRef: queue-scorer, weight: 1}
"""
    )
    plugin = sched.plugins["lora-residency-scorer"]
    plugin.clock = FakeClock()
    seen = [pod("a", ["lora-1"], max_active=2), pod("b", max_active=2), pod("c", max_active=2)]
    first = sched.schedule(request(model="lora-1", request_id="1"), seen).target.name
    assert first == "a"
    # lora-1 finished on "a"; its next request comes when "a" is busier and no scrape lists it.
    plugin.clock.now += 5
    later = [pod("a", ["x"], max_active=2, waiting_queue_size=3), pod("b", max_active=2), pod("c", max_active=2)]
    assert sched.schedule(request(model="lora-1", request_id="2"), later).target.name == "a"
