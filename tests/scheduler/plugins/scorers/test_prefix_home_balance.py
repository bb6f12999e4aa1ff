"""prefix-home-balance-scorer: a table of cold requests over a real prefix index (the endpoint holding
the fewest blocks wins; min-max or relative to the most held), warm requests neutral, and in a real
scheduler the first requests of new prefix groups spread one home per endpoint while each group's
next request follows its prefix."""

from __future__ import annotations

import pickle

import pytest

from scheduler import Scheduler
from scheduler.config import load_config
from scheduler.errors import ConfigError
from scheduler.plugins.scorers.prefix_home_balance import PrefixHomeBalanceScorer
from scheduler.plugins.support.prefix import PREFIX_INDEX_HOLDINGS, PREFIX_MATCH_INFO
from scheduler.types import ProfileRunResult, SchedulingResult
from tests.scheduler.helpers import as_in_profile, endpoint, fresh_state, request

EPS = [endpoint("a"), endpoint("b"), endpoint("c")]


def scheduler(*, with_balance: bool = True, **params: str) -> tuple[Scheduler, PrefixHomeBalanceScorer | None]:
    plugins = [{"type": "approx-prefix-cache-producer"}, {"type": "prefix-cache-scorer"}]
    refs = [{"pluginRef": "prefix-cache-scorer", "weight": 3}]
    if with_balance:
        plugins.append({"type": "prefix-home-balance-scorer", "parameters": params})
        refs.append({"pluginRef": "prefix-home-balance-scorer", "weight": 2})
    sched = Scheduler.from_config(
        load_config({"plugins": plugins, "schedulingProfiles": [{"name": "default", "plugins": refs}]})
    )
    return sched, sched.plugins.get("prefix-home-balance-scorer")


def group_prompt(group: int, question: int = 0) -> str:
    """A prefix group's prompt: a long system prompt of its own, then a short question."""
    return f"system prompt of group {group}, long enough to fill cache blocks. " * 40 + f"question {question}"


def sent(sched: Scheduler, name: str, prompt: str, request_id: str) -> None:
    """Tell the scheduler's index that `prompt` went to `name` (as a decision for it would)."""
    req = request(prompt=prompt, request_id=request_id)
    sched.plugins["approx-prefix-cache-producer"].produce(fresh_state(), req, EPS)
    sched.plugins["approx-prefix-cache-producer"].learn(
        req, SchedulingResult({"default": ProfileRunResult([endpoint(name)])}, "default")
    )


@pytest.mark.parametrize(
    ("history", "want"),
    [
        ([], [1.0, 1.0, 1.0]),  # an empty index: neutral
        ([("a", 1)], [0.0, 1.0, 1.0]),  # a holds one group: the others first
        ([("a", 1), ("b", 2)], [0.0, 0.0, 1.0]),  # equal holdings tie
        ([("a", 1), ("a", 2), ("b", 3)], [0.0, 0.5, 1.0]),  # blocks held, relative to the most
        ([("a", 1), ("b", 2), ("c", 3)], [1.0, 1.0, 1.0]),  # all equal: neutral
    ],
)
def test_a_cold_request_prefers_the_endpoint_holding_least(history, want):
    sched, s = scheduler()
    for i, (name, group) in enumerate(history):
        sent(sched, name, group_prompt(group), f"h{i}")
    scores = as_in_profile(sched, s, request(prompt=group_prompt(99), request_id="x"), EPS)
    assert [scores[e] for e in EPS] == pytest.approx(want)


def holdings(*counts: int) -> list[tuple[str, int]]:
    """Endpoint i home to counts[i] groups of its own."""
    out, group = [], 0
    for name, n in zip("abc", counts, strict=False):
        for _ in range(n):
            out.append((name, group))
            group += 1
    return out


@pytest.mark.parametrize(
    ("history", "normalize", "want"),
    [
        (holdings(2, 1, 0), "min-max", [0.0, 0.5, 1.0]),
        (holdings(2, 1, 0), "relative", [0.0, 0.5, 1.0]),  # the same while one endpoint holds nothing
        (holdings(2, 1, 2), "min-max", [0.0, 1.0, 0.0]),
        (holdings(2, 1, 2), "relative", [0.0, 0.5, 0.0]),  # one group fewer of two: half
        (holdings(10, 9, 10), "min-max", [0.0, 1.0, 0.0]),  # a gap of 10 % decides outright
        (holdings(10, 9, 10), "relative", [0.0, 0.1, 0.0]),  # ... or counts 10 %
        (holdings(1, 1, 1), "relative", [1.0, 1.0, 1.0]),  # all equal: neutral
    ],
)
def test_min_max_or_relative_to_the_most_held(history, normalize, want):
    sched, s = scheduler(normalize=normalize)
    for i, (name, group) in enumerate(history):
        sent(sched, name, group_prompt(group), f"h{i}")
    scores = as_in_profile(sched, s, request(prompt=group_prompt(99), request_id="x"), EPS)
    assert [scores[e] for e in EPS] == pytest.approx(want)


def test_an_unknown_normalization_is_a_config_error():
    with pytest.raises(ConfigError, match="normalize"):
        scheduler(normalize="rank")


def test_a_warm_request_scores_every_endpoint_alike():
    sched, s = scheduler()
    sent(sched, "a", group_prompt(1), "h0")
    sent(sched, "a", group_prompt(2), "h1")
    scores = as_in_profile(sched, s, request(prompt=group_prompt(1, question=7), request_id="w"), EPS)
    assert set(scores.values()) == {1.0}  # the choice is prefix affinity's


def test_no_candidates_and_a_lone_candidate():
    sched, s = scheduler()
    assert as_in_profile(sched, s, request(prompt="x"), []) == {}
    assert list(as_in_profile(sched, s, request(prompt="x"), [endpoint("a")]).values()) == [1.0]


@pytest.mark.parametrize("with_balance", [True, False])
def test_new_groups_get_one_home_each_and_their_requests_follow(with_balance):
    """Three groups born on three endpoints: with the scorer each endpoint becomes one group's home
    whatever the tie-break; without it the tie-break (random) decides and homes pile up in some of
    the seeds, which is the case the scorer exists for."""
    piled = 0
    for seed in range(8):
        sched, _ = scheduler(with_balance=with_balance)
        sched.cycle_seeds.seed(seed)
        homes = []
        for group in range(3):
            result = sched.schedule(request(prompt=group_prompt(group), request_id=f"g{group}"), EPS)
            homes.append(result.profile_results["default"].target_endpoints[0].name)
        for group in range(3):  # each group's next request goes home
            result = sched.schedule(request(prompt=group_prompt(group, 1), request_id=f"n{group}"), EPS)
            assert result.profile_results["default"].target_endpoints[0].name == homes[group]
        piled += len(set(homes)) < 3
    if with_balance:
        assert piled == 0
    else:
        assert piled > 0


def test_config_needs_prefix_match_data():
    with pytest.raises(
        ConfigError, match="reads the data key 'prefix-cache-match-info/approx-prefix-cache-producer', which no plugin"
    ):
        load_config({"plugins": [{"type": "prefix-home-balance-scorer"}]})


def test_the_producer_writes_its_index_holdings_and_a_copy_elsewhere_holds_nothing():
    sched, s = scheduler()
    sent(sched, "a", group_prompt(1), "h0")
    producer = sched.plugins["approx-prefix-cache-producer"]
    assert s.consumes == (PREFIX_MATCH_INFO, PREFIX_INDEX_HOLDINGS)  # a declared read, not the index itself
    state = fresh_state()
    producer.produce(state, request(prompt="x"), EPS)
    holdings = state.get(PREFIX_INDEX_HOLDINGS)
    assert holdings is not None and holdings.blocks("a") > 0 and holdings.blocks("b") == 0
    assert pickle.loads(pickle.dumps(holdings)).blocks("a") == 0  # the index stays in its process
