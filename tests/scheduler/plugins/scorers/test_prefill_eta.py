"""prefill-eta-scorer: pending prompt tokens weighted by the share of their predicted TTFT still to
run (learned from first tokens), table-driven with a fake clock; then in bench/configs/default-eta.yaml."""

import pytest

from scheduler import ProfileRunResult, ResponseComplete, ResponseFirstToken, Scheduler, SchedulingResult
from scheduler.config import load_config_file
from scheduler.plugins.scorers.prefill_eta import PrefillEtaParameters, PrefillEtaScorer
from scheduler.plugins.support.prefix.match_info import PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from tests.scheduler.helpers import FakeClock, endpoint, fresh_state, request
from tests.scheduler.test_config import CONFIGS

# Ray EPP's default until 2026-12-03 (docs/decisions/0007-default-fading-ledger.md, "The previous
# default, as compared"): the config today's default and bench/configs/default-eta.yaml vary.
PREVIOUS_DEFAULT = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: prefill-backlog-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: prefill-backlog-scorer
    weight: 4
"""

A, B, C = endpoint("pod-a"), endpoint("pod-b"), endpoint("pod-c")
PODS = {"pod-a": A, "pod-b": B, "pod-c": C}


def scorer(**params) -> PrefillEtaScorer:
    s = PrefillEtaScorer(params=PrefillEtaParameters(**params))
    s.clock = FakeClock()
    return s


def send(s: PrefillEtaScorer, pod: str, chars: int, request_id: str, match: PrefixCacheMatchInfo | None = None):
    """Tell the scorer a request of `chars` prompt characters (4 a token) went to `pod`."""
    target = PODS[pod].with_attributes({PREFIX_MATCH_KEY: match}) if match else PODS[pod]
    req = request(prompt="x" * chars, request_id=request_id)
    s.pre_request(req, SchedulingResult({"default": ProfileRunResult([target])}, primary_profile_name="default"))
    return req


def teach(s: PrefillEtaScorer, pod: str, n: int = 40, noise: float = 0.0) -> None:
    """n first tokens from `pod` whose TTFT is 20 ms + 40 ms per 1,000 uncached tokens (+- noise)."""
    for i in range(n):
        chars = 1000 * (1 + i % 8)  # 250 .. 2,000 tokens
        req = send(s, pod, chars, f"seen-{pod}-{i}")
        s.clock.now += 0.02 + 0.04 * chars / 4000 + (noise if i % 2 else -noise)
        s.response_first_token(req, pod)


def weighted(s: PrefillEtaScorer, pod: str, tokens: int, age: float, horizon: float = 1.0) -> float:
    """What an entry of `tokens` sent `age` s ago counts for, by the scorer's own prediction (at
    least one token while it is pending)."""
    return max(1.0, tokens * max(0.0, 1 - age / (s.expected_ttft(pod, tokens) * horizon)))


def test_cold_every_entry_counts_in_full():
    s = scorer(minSamples=4)
    teach(s, "pod-a", n=3)
    send(s, "pod-a", 4000, "r1")
    s.clock.now += 0.5
    send(s, "pod-b", 2000, "r2")
    assert s.expected_ttft("pod-a", 1000) is None
    assert s.backlog() == {"pod-a": 1000, "pod-b": 500}


def test_it_learns_ttft_from_first_tokens_per_endpoint_with_the_pool_as_prior():
    s = scorer()
    teach(s, "pod-a")
    assert s.expected_ttft("pod-a", 1000) == pytest.approx(0.06, rel=0.02)
    assert s.expected_ttft("pod-a", 250) == pytest.approx(0.03, rel=0.02)
    assert s.expected_ttft("pod-c", 1000) == pytest.approx(0.06, rel=0.02)  # no first token of its own yet


@pytest.mark.parametrize(
    ("sends", "wait", "expected"),
    [
        pytest.param(
            [("pod-a", 4000)], 0.015, lambda s: {"pod-a": weighted(s, "pod-a", 1000, 0.015)}, id="a quarter gone"
        ),
        pytest.param(
            [("pod-a", 4000)], 0.07, lambda s: {"pod-a": 1.0}, id="past its expected first token: one token, pending"
        ),
        pytest.param(
            [("pod-a", 4000), ("pod-a", 1000)],
            0.02,
            lambda s: {"pod-a": weighted(s, "pod-a", 1000, 0.02) + weighted(s, "pod-a", 250, 0.02)},
            id="entries at one endpoint add up; a short prompt fades sooner",
        ),
        pytest.param(
            [("pod-a", 4000), ("pod-b", 4000)],
            0.03,
            lambda s: {"pod-a": weighted(s, "pod-a", 1000, 0.03), "pod-b": weighted(s, "pod-b", 1000, 0.03)},
            id="an endpoint with no first token yet predicts from the pool's fit",
        ),
    ],
)
def test_pending_prompts_fade_as_their_first_token_nears(sends, wait, expected):
    s = scorer()
    teach(s, "pod-a")
    for i, (pod, chars) in enumerate(sends):
        send(s, pod, chars, f"r{i}")
    s.clock.now += wait
    assert s.backlog() == pytest.approx(expected(s))


@pytest.mark.parametrize(
    ("noise", "first_wait", "late"),
    [
        pytest.param(0.0, 0.1, True, id="oldest far past its expected TTFT: late, the endpoint's horizon stretches"),
        pytest.param(0.01, 0.06, False, id="oldest past its expected TTFT within 4 mean deviations: not late"),
    ],
)
def test_a_late_endpoint_keeps_its_backlog(noise, first_wait, late):
    s = scorer()
    teach(s, "pod-a", noise=noise)
    send(s, "pod-a", 4000, "old")
    s.clock.now += first_wait
    send(s, "pod-a", 4000, "new")
    s.clock.now += 0.01
    oldest = first_wait + 0.01
    horizon = oldest / s.expected_ttft("pod-a", 1000) if late else 1.0
    both = weighted(s, "pod-a", 1000, oldest, horizon) + weighted(s, "pod-a", 1000, 0.01, horizon)
    assert s.backlog() == pytest.approx({"pod-a": both})
    assert weighted(s, "pod-a", 1000, oldest, horizon) == 1.0  # the oldest itself counts for one token


def test_min_weight_keeps_a_share_past_the_expected_first_token():
    s = scorer(minWeight=0.25)
    teach(s, "pod-a")
    send(s, "pod-a", 4000, "r1")
    s.clock.now += 0.065  # past its 60 ms (and late: its weight alone would be 0)
    assert s.backlog() == pytest.approx({"pod-a": 250.0})


@pytest.mark.parametrize(
    ("matches", "expected"),
    [
        pytest.param(None, {"pod-a": 0.0, "pod-b": 1.0, "pod-c": 1.0}, id="min-max over faded backlog + own tokens"),
        pytest.param(
            {"pod-a": PrefixCacheMatchInfo(60, 62, 16)},  # 960 of the 1,000 tokens cached: ~500 + 40 vs 1,000
            {"pod-a": 1.0, "pod-b": 0.0, "pod-c": 0.0},
            id="a cached prefix outweighs a faded backlog",
        ),
    ],
)
def test_scores(matches, expected):
    s = scorer()
    teach(s, "pod-a")
    send(s, "pod-a", 4000, "r1")
    s.clock.now += 0.03  # about half of its 60 ms left
    state = fresh_state()
    if matches:
        state.set_endpoint_attributes(PREFIX_MATCH_KEY, matches)
    got = s.score(state, request(prompt="y" * 4000), [A, B, C])
    assert {ep.name: v for ep, v in got.items()} == pytest.approx(expected)


@pytest.mark.parametrize(
    ("wait", "expected"),
    [
        pytest.param(0.07, {"pod-a": 0.0, "pod-b": 1.0}, id="past its expected first token: still worse than idle"),
        pytest.param(0.03, {"pod-a": 0.0, "pod-b": 1.0}, id="half its expected first token ahead"),
    ],
)
def test_an_unanswered_prompt_never_ties_with_an_idle_endpoint(wait, expected):
    """A prompt past its expected first token is unanswered: its endpoint is mid-step, and a new
    request there waits for the rest of that step, where the idle one starts it at once."""
    s = scorer()
    teach(s, "pod-a")
    send(s, "pod-a", 4000, "r1")
    s.clock.now += wait
    got = s.score(fresh_state(), request(prompt="y" * 4000), [A, B])
    assert {ep.name: v for ep, v in got.items()} == pytest.approx(expected)


def test_release_retry_and_timeout():
    s = scorer(requestTimeout="30s", minSamples=1)
    lost = send(s, "pod-a", 4000, "r1")
    retried = send(s, "pod-b", 4000, "r2")
    send(s, "pod-c", 4000, "r2")  # the retry went elsewhere: counted once, there
    assert s.backlog() == {"pod-a": 1000, "pod-c": 1000}
    s.response_complete(retried, "pod-c")  # a completion without a first token releases, teaches nothing
    assert s.backlog() == {"pod-a": 1000}
    assert s.expected_ttft("pod-c", 1000) is None
    s.clock.now += 31
    assert s.backlog() == {}
    s.response_first_token(lost, "pod-a")  # expired already: ignored
    assert s.expected_ttft("pod-a", 1000) is None


def test_roles_and_parameters():
    s = PrefillEtaScorer()
    assert isinstance(s, ResponseFirstToken) and isinstance(s, ResponseComplete)
    assert (s.params.ttft_smoothing, s.params.min_weight, s.params.min_samples) == (0.1, 0.0, 16)
    for bad in ({"ttftSmoothing": 0}, {"ttftSmoothing": 1.5}, {"minWeight": -0.1}, {"minWeight": 2}, {"minSamples": 0}):
        with pytest.raises(ValueError):
            PrefillEtaParameters(**bad)


def test_the_default_eta_config_loads_and_schedules_with_it():
    """bench/configs/default-eta.yaml: the next request goes to the pod whose pending prompt is nearly done,
    not to the one that was just sent a shorter prompt (the token ledger would pick the latter)."""
    sched = Scheduler.from_config(load_config_file(CONFIGS.parents[1] / "bench" / "configs" / "default-eta.yaml"))
    eta = next(p for p in sched.plugins.values() if isinstance(p, PrefillEtaScorer))
    eta.clock = FakeClock()
    teach(eta, "pod-a")  # TTFT 20 ms + 40 ms per 1,000 tokens, learned
    pods = [endpoint("pod-a"), endpoint("pod-b")]
    big = request(prompt="b" * 4000, request_id="big")  # 1,000 tokens: 60 ms expected
    big_pod = sched.schedule(big, pods).target.name
    eta.clock.now += 0.055  # nearly answered: under 100 tokens' worth left
    small = request(prompt="s" * 1200, request_id="small")  # 300 tokens: to the other pod (less work)
    small_pod = sched.schedule(small, pods).target.name
    assert small_pod != big_pod
    nxt = sched.schedule(request(prompt="n" * 2000, request_id="next"), pods).target.name
    assert nxt == big_pod


@pytest.mark.parametrize(
    ("experiment", "shipped"),
    [
        ("default-eta.yaml", PREVIOUS_DEFAULT),
        ("lora-eta.yaml", CONFIGS / "lora.yaml"),
    ],
)
def test_the_eta_experiments_are_their_shipped_config_with_one_scorer_swapped(experiment, shipped):
    """bench/configs/*-eta.yaml measure one change only: the same plugins, parameters and weights as
    the config they vary (the previous default, ray_epp/configs/lora.yaml), prefill-eta-scorer in place of
    prefill-backlog-scorer."""
    swap = {"prefill-backlog-scorer": "prefill-eta-scorer"}

    def body(path):
        cfg = load_config_file(path)
        plugins = [(swap.get(p.type, p.type), p.parameters) for p in cfg.plugins]
        (profile,) = cfg.scheduling_profiles
        return plugins, [(swap.get(r.plugin_ref, r.plugin_ref), r.weight) for r in profile.plugins]

    assert body(CONFIGS.parents[1] / "bench" / "configs" / experiment) == body(shipped)


def test_the_default_is_the_previous_one_with_the_fading_ledger_the_home_balance_and_the_filter():
    """bench/configs/default-unsticky.yaml = the previous default with prefill-eta-scorer
    (floored at minWeight 0.25) in place of prefill-backlog-scorer (same weight) and
    prefix-home-balance-scorer x2 (relative) added: nothing else moved;
    bench/configs/default-minmax.yaml differs from it in the home balance's normalization alone;
    bench/configs/default-gie-queue.yaml is it behind prefix-cache-affinity-filter (a 250 ms gate and
    the scraped-saturation escape), bench/configs/agentic.yaml the same without the escape, and
    ray_epp/configs/default.yaml the first with load-aware-scorer (threshold 5) x4 for queue-scorer x2."""

    def body(path):
        cfg = load_config_file(path)
        (profile,) = cfg.scheduling_profiles
        plugins = sorted((p.type, repr(p.parameters)) for p in cfg.plugins)
        return plugins, sorted((r.plugin_ref, r.weight or 0) for r in profile.plugins)

    plugins, weights = body(PREVIOUS_DEFAULT)
    swap = {"prefill-backlog-scorer": "prefill-eta-scorer"}
    plugins = [(swap[t], repr({"minWeight": 0.25})) if t in swap else (t, params) for t, params in plugins]
    weights = [(swap.get(ref, ref), w) for ref, w in weights]
    want = (
        sorted([*plugins, ("prefix-home-balance-scorer", repr({"normalize": "relative"}))]),
        sorted([*weights, ("prefix-home-balance-scorer", 2)]),
    )
    bench_configs = CONFIGS.parents[1] / "bench" / "configs"
    assert body(bench_configs / "default-unsticky.yaml") == want
    escape = [{"metric": "waiting-queue", "maxValue": 5}, {"metric": "kv-cache-utilization", "maxValue": 0.8}]
    for path, params in (
        (bench_configs / "default-gie-queue.yaml", {"maxTTFTPenaltyMs": 250, "saturationConditions": escape}),
        (bench_configs / "agentic.yaml", {"maxTTFTPenaltyMs": 250}),
    ):
        sticky = ("prefix-cache-affinity-filter", repr(params))
        assert body(path) == (sorted([*want[0], sticky]), sorted([*want[1], ("prefix-cache-affinity-filter", 0)]))
    minmax_plugins, minmax_weights = body(CONFIGS.parents[1] / "bench" / "configs" / "default-minmax.yaml")
    relative = ("prefix-home-balance-scorer", repr({"normalize": "relative"}))
    minmax = ("prefix-home-balance-scorer", repr({"normalize": "min-max"}))
    assert (sorted(relative if p == minmax else p for p in minmax_plugins), minmax_weights) == want
    gie_queue_plugins, gie_queue_weights = body(bench_configs / "default-gie-queue.yaml")
    queue = {("queue-scorer", repr(None)): ("load-aware-scorer", repr({"threshold": 5}))}
    against_the_line = {("queue-scorer", 2): ("load-aware-scorer", 4)}
    assert body(CONFIGS / "default.yaml") == (
        sorted(queue.get(p, p) for p in gie_queue_plugins),
        sorted(against_the_line.get(w, w) for w in gie_queue_weights),
    )
