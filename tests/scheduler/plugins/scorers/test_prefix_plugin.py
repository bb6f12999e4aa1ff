"""prefix-cache-scorer in GIE's combined form: GIE's approximate-prefix producer tests
(approximateprefix/plugin_test.go, and the earlier one-plugin scorer/prefix/plugin_test.go
sequences) and the scorer's own test, on the producer and scorer the loader expands it into, run as
a profile runs them (the producer, then the scorer; the producer learns in PreRequest)."""

import pytest
from pydantic import ValidationError

from scheduler import ConfigError, CycleState, LLMRequest, ProfileRunResult, SchedulingResult, ScorerCategory
from scheduler.config import build_plugins, load_config
from scheduler.plugins.producers.gie_prefix import GIEPrefixCacheParameters, GIEPrefixCacheProducer
from scheduler.plugins.scorers.prefix_cache import PrefixCacheParameters, PrefixCacheScorer
from scheduler.plugins.support.prefix import (
    PREFIX_MATCH_KEY,
    PrefixCacheMatchInfo,
    hash_prompt,
    prefix_block_hashes,
    set_prefix_block_hashes,
)
from scheduler.registry import plugin_class
from tests.scheduler.helpers import endpoint, request


class Combined:
    """A combined-form scorer as the loader builds it, run as a profile runs its plugins."""

    def __init__(self, **params) -> None:
        cfg = {"plugins": [{"name": "pfx", "type": "prefix-cache-scorer", "parameters": params}]}
        built = build_plugins(load_config(cfg))
        self.scorer: PrefixCacheScorer = built.plugins["pfx"]  # type: ignore[assignment]
        self.producer: GIEPrefixCacheProducer = built.plugins["pfx/producer"]  # type: ignore[assignment]
        assert built.profiles["default"].producers == [self.producer]

    def score(self, state: CycleState, req: LLMRequest, endpoints):
        self.producer.produce(state, req, endpoints)
        return self.scorer.score(state, req, endpoints)

    def pre_request(self, req: LLMRequest, result: SchedulingResult) -> None:
        self.producer.pre_request(req, result)


def scorer(**params) -> Combined:
    return Combined(**params)


def decided(primary, prefill=None, primary_name="default") -> SchedulingResult:
    results = {primary_name: ProfileRunResult([primary]) if primary is not None else None}
    if prefill is not None:
        results["prefill"] = ProfileRunResult([prefill])
    return SchedulingResult(results, primary_name)


def completion(model: str, prompt: str) -> LLMRequest:
    return request(model=model, prompt=prompt)


def chat(model: str, *messages) -> LLMRequest:
    return LLMRequest("r", model, body={"model": model, "messages": [{"role": r, "content": c} for r, c in messages]})


def score(plugin, req, endpoints):
    state = CycleState()
    scores = plugin.score(state, req, endpoints)
    infos = {ep.name: state.endpoint_attributes(ep.name).get(PREFIX_MATCH_KEY) for ep in endpoints}
    return scores, infos


# -- parameters -------------------------------------------------------------------------------


def test_registered_as_an_affinity_scorer_with_a_producer_that_learns():
    assert plugin_class("prefix-cache-scorer") is PrefixCacheScorer
    assert PrefixCacheScorer.category is ScorerCategory.AFFINITY
    p = scorer().producer
    assert (p.auto_tune, p.default_block_size_tokens, p.max_prefix_blocks, p.lru_capacity) == (True, 16, 256, 31250)


@pytest.mark.parametrize(
    ("params", "valid"),
    [
        pytest.param({"autoTune": False, "blockSizeTokens": 1}, True, id="no autoTune, block size"),
        pytest.param({"autoTune": False, "blockSize": 1, "blockSizeTokens": 1}, True, id="deprecated with new"),
        pytest.param({"autoTune": True, "blockSizeTokens": 0}, True, id="autoTune, zero block size"),
        pytest.param({"autoTune": False, "blockSize": 1}, False, id="deprecated blockSize alone"),
        pytest.param({"blockSize": 64}, False, id="deprecated blockSize alone, autoTune default"),
        pytest.param({"autoTune": False, "blockSizeTokens": 0}, False, id="no autoTune, zero block size"),
        pytest.param({"maxPrefixTokensToMatch": -1}, False, id="negative maxPrefixTokensToMatch"),
        pytest.param({"maxPrefixBlocksToMatch": -10}, False, id="negative maxPrefixBlocksToMatch"),
        pytest.param({"lruCapacityPerServer": -100}, False, id="negative lruCapacityPerServer"),
        pytest.param({"hashBlockSize": 64}, False, id="unknown parameter"),
    ],
)
def test_parameter_validation(params, valid):
    if valid:
        GIEPrefixCacheParameters.model_validate(params)
    else:
        with pytest.raises(ValidationError):
            GIEPrefixCacheParameters.model_validate(params)
    with pytest.raises(ValidationError):  # the scorer itself takes none of them
        PrefixCacheParameters.model_validate(params)


def test_config_errors_name_the_plugin_and_field():
    with pytest.raises(ConfigError) as err:
        load_config({"plugins": [{"name": "pfx", "type": "prefix-cache-scorer", "parameters": {"blockSize": 64}}]})
    assert "'pfx'" in str(err.value) and "blockSize" in str(err.value) and "deprecated" in str(err.value)


# (blockSizeTokens, maxPrefixBlocksToMatch, lruCapacityPerServer) given → in effect
@pytest.mark.parametrize(
    ("given", "effective"),
    [
        pytest.param((0, 0, 0), (16, 256, 31250), id="all zero"),
        pytest.param((32, 0, 50000), (32, 256, 50000), id="mixed set and unset"),
        pytest.param((64, 200, 30000), (64, 200, 30000), id="all set"),
    ],
)
def test_unset_values_take_the_defaults(given, effective):
    p = scorer(**dict(zip(("blockSizeTokens", "maxPrefixBlocksToMatch", "lruCapacityPerServer"), given, strict=True)))
    p = p.producer
    assert (p.default_block_size_tokens, p.max_prefix_blocks, p.lru_capacity) == effective
    assert p.index.default_capacity == effective[2]


# -- scoring and learning ----------------------------------------------------------------------

# GIE's completion sequence: (model, prompt, primary, prefill, total blocks, expected scores by pod).
# Block size 1 token = 4 characters; a trailing partial block counts.
COMPLETION_STEPS = [
    ("test-model1", "aaaaaa", "pod1", "pod3", 2, {"pod1": 0.0, "pod2": 0.0, "pod3": 0.0}),
    ("test-model2", "bbbbbb", "pod2", None, 2, {"pod1": 0.0, "pod2": 0.0, "pod3": 0.0}),
    # shares "aaaa" with the first request, learned by pod1 and by pod3 as its prefill pod
    ("test-model1", "aaaabbbb", "pod1", None, 2, {"pod1": 0.5, "pod2": 0.0, "pod3": 0.5}),
    # same text, another model: nothing matches
    ("test-model-new", "aaaabbbb", "pod1", None, 2, {"pod1": 0.0, "pod2": 0.0, "pod3": 0.0}),
    # shares "aaaabbbb" with the third request (pod1) and "aaaa" with the first (pod1, pod3)
    ("test-model1", "aaaabbbbcccc", "pod1", None, 3, {"pod1": 2 / 3, "pod2": 0.0, "pod3": 1 / 3}),
]


def test_completion_sequence():
    plugin = scorer(autoTune=False, blockSizeTokens=1)
    pods = {name: endpoint(name) for name in ("pod1", "pod2", "pod3")}
    eps = list(pods.values())
    for i, (model, prompt, primary, prefill, total, expected) in enumerate(COMPLETION_STEPS):
        req = completion(model, prompt)
        scores, infos = score(plugin, req, eps)
        assert len(prefix_block_hashes(req, 1, 256)) == total, f"step {i}"
        assert {ep.name: s for ep, s in scores.items()} == pytest.approx(expected), f"step {i}"
        for name, info in infos.items():
            assert info == PrefixCacheMatchInfo(round(expected[name] * total), total, 1), f"step {i} {name}"
        plugin.pre_request(req, decided(pods[primary], pods[prefill] if prefill else None))


def test_match_info_on_every_endpoint():
    """GIE's PrepareRequestData test: after pod1 served "aaaabbbb", "aaaacccc" matches one block."""
    plugin = scorer(blockSizeTokens=1)
    pod1, pod2 = endpoint("pod1"), endpoint("pod2")
    first = completion("test-model1", "aaaabbbb")
    _, infos = score(plugin, first, [pod1, pod2])
    assert infos == {"pod1": PrefixCacheMatchInfo(0, 2, 1), "pod2": PrefixCacheMatchInfo(0, 2, 1)}
    plugin.pre_request(first, decided(pod1))

    _, infos = score(plugin, completion("test-model1", "aaaacccc"), [pod1, pod2])
    assert infos["pod1"] == PrefixCacheMatchInfo(1, 2, 1)
    assert infos["pod1"].match_tokens == 1 and infos["pod1"].match_ratio == 0.5
    assert infos["pod2"] == PrefixCacheMatchInfo(0, 2, 1)


def test_pre_request_indexes_every_block_for_the_target():
    plugin = scorer(blockSizeTokens=1)
    pod1 = endpoint("pod1")
    req = completion("test-model1", "aaaabbbb")
    score(plugin, req, [pod1])
    plugin.pre_request(req, decided(pod1))
    for h in hash_prompt("aaaabbbb", "test-model1", 1, 256):
        assert plugin.producer.index.get(h) == {"pod1"}


def test_scores_are_matched_over_total_blocks():
    """The scorer test: 5 of 10 blocks → 0.5, 2 of 10 → 0.2."""
    plugin = scorer(autoTune=False, blockSizeTokens=1)
    prompt = "".join(chr(ord("a") + i) * 4 for i in range(10))
    pod1, pod2 = endpoint("pod1"), endpoint("pod2")
    for pod, blocks in ((pod1, 5), (pod2, 2)):
        learned = completion("m", prompt[: 4 * blocks])
        plugin.pre_request(learned, decided(pod))
    scores, infos = score(plugin, completion("m", prompt), [pod1, pod2])
    assert scores == {pod1: 0.5, pod2: 0.2}
    assert infos == {"pod1": PrefixCacheMatchInfo(5, 10, 1), "pod2": PrefixCacheMatchInfo(2, 10, 1)}


def test_chat_completions_start_without_matches():
    plugin = scorer(blockSizeTokens=1)
    pod1 = endpoint("pod1")
    req = chat("test-model1", ("user", "hello world"), ("assistant", "hi there"))
    scores, _ = score(plugin, req, [pod1])
    assert len(prefix_block_hashes(req, 1, 256)) > 1
    assert scores == {pod1: 0.0}


def test_chat_completions_growth():
    plugin = scorer(autoTune=False, blockSizeTokens=2)
    pod1, pod2 = endpoint("pod1"), endpoint("pod2")
    turns = [
        ("system", "You are a helpful assistant"),
        ("user", "Hello, how are you?"),
        ("assistant", "I'm doing well, thank you! How can I help you today?"),
        ("user", "Can you explain how prefix caching works?"),
        ("assistant", "Prefix caching is a technique where..."),
        ("user", "That's very helpful, thank you!"),
    ]
    totals = []
    for step, n in enumerate((2, 4, 6)):
        req = chat("test-model1", *turns[:n])
        scores, infos = score(plugin, req, [pod1, pod2])
        total = len(prefix_block_hashes(req, 2, 256))
        totals.append(total)
        assert infos["pod1"].total_blocks == total
        assert scores[pod1] == infos["pod1"].match_blocks / total
        assert scores[pod2] == 0.0
        if step == 0:
            assert scores[pod1] == 0.0
        else:
            assert infos["pod1"].match_blocks > 0, "the earlier conversation is a cached prefix"
        if step == 2:
            assert scores[pod1] > 0.5
        plugin.pre_request(req, decided(pod1))
    assert totals[0] < totals[1] < totals[2]


def image_message(url: str) -> tuple[str, list]:
    return ("user", [{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": url}}])


@pytest.mark.parametrize(
    ("second", "full_match"),
    [
        pytest.param([image_message("https://storage.googleapis.com/abc1/sample1.jpg")], True, id="same image url"),
        pytest.param(
            [
                image_message("https://storage.googleapis.com/bucket2/sample2.jpg"),
                ("assistant", "This is a sample image."),
                ("user", "What else do you see?"),
            ],
            False,
            id="different image url",
        ),
    ],
)
def test_chat_completions_multimodal(second, full_match):
    plugin = scorer(autoTune=False, blockSizeTokens=32)
    pod1 = endpoint("pod1")
    first = chat("test-model1", image_message("https://storage.googleapis.com/abc1/sample1.jpg"))
    score(plugin, first, [pod1])
    plugin.pre_request(first, decided(pod1))
    _, infos = score(plugin, chat("test-model1", *second), [pod1])
    info = infos["pod1"]
    assert info.total_blocks > 0
    assert (info.match_blocks == info.total_blocks) is full_match


def test_auto_tune_uses_the_endpoint_block_size_and_cache_size():
    pod = endpoint("pod-autotune", cache_block_size=16, cache_num_blocks=1000)
    req = completion("test-model", "a" * 128)
    plugin = scorer(autoTune=True, blockSizeTokens=32, lruCapacityPerServer=1)
    _, infos = score(plugin, req, [pod])
    assert infos["pod-autotune"] == PrefixCacheMatchInfo(0, 2, 16)  # 128 chars / (16 tokens x 4)
    plugin.pre_request(req, decided(pod))
    assert plugin.producer.index.servers() == ["pod-autotune"]
    assert plugin.producer.index.server_capacity("pod-autotune") == 1000
    assert plugin.producer.index.server_size("pod-autotune") == 2


def test_without_auto_tune_the_configured_sizes_apply():
    pod = endpoint("pod-autotune", cache_block_size=16, cache_num_blocks=1000)
    req = completion("test-model", "a" * 128)
    plugin = scorer(autoTune=False, blockSizeTokens=8, lruCapacityPerServer=1)
    _, infos = score(plugin, req, [pod])
    assert infos["pod-autotune"].total_blocks == 4  # 128 chars / (8 tokens x 4)
    plugin.pre_request(req, decided(pod))
    assert plugin.producer.index.server_capacity("pod-autotune") == 1
    hashes = prefix_block_hashes(req, 8, 256)
    assert plugin.producer.index.get(hashes[0]) == set(), "the first blocks were evicted"
    assert plugin.producer.index.get(hashes[-1]) == {"pod-autotune"}


@pytest.mark.parametrize(
    ("params", "blocks"),
    [
        pytest.param({"maxPrefixTokensToMatch": 2}, 2, id="tokens cap: 2 tokens / 1 per block"),
        pytest.param({"maxPrefixTokensToMatch": 0, "maxPrefixBlocksToMatch": 3}, 3, id="unset: max blocks"),
        pytest.param({"maxPrefixTokensToMatch": 3, "maxPrefixBlocksToMatch": 1}, 3, id="tokens take precedence"),
    ],
)
def test_max_prefix_tokens_to_match(params, blocks):
    plugin = scorer(blockSizeTokens=1, **params)
    _, infos = score(plugin, completion("test-model", "aaaabbbbccccdddd"), [endpoint("pod1")])
    assert infos["pod1"].total_blocks == blocks


def test_short_prompt_scores_zero_with_match_info():
    plugin = scorer()
    pod = endpoint("pod1")
    req = completion("m", "hi")
    scores, infos = score(plugin, req, [pod])
    assert scores == {pod: 0.0}
    assert infos["pod1"] == PrefixCacheMatchInfo(0, 0, 16)
    plugin.pre_request(req, decided(pod))
    assert plugin.producer.index.servers() == []


def test_no_endpoints():
    assert scorer().score(CycleState(), completion("m", "a" * 100), []) == {}


@pytest.mark.parametrize(
    ("result", "learned"),
    [
        pytest.param(decided(endpoint("d1"), endpoint("p1"), "decode"), {"d1", "p1"}, id="decode primary + prefill"),
        pytest.param(decided(endpoint("p1"), None, "prefill"), {"p1"}, id="prefill is the primary"),
        pytest.param(
            SchedulingResult({"decode": ProfileRunResult([endpoint("d1")]), "prefill": None}, "decode"),
            {"d1"},
            id="prefill profile failed",
        ),
        pytest.param(
            SchedulingResult({"decode": ProfileRunResult([endpoint("d1"), endpoint("d2")])}, "decode"),
            {"d1"},
            id="only the first target",
        ),
        pytest.param(
            SchedulingResult(
                {"decode": ProfileRunResult([endpoint("d1")]), "pf": ProfileRunResult([endpoint("p1")])},
                "decode",
                prefill_profile_name="pf",
            ),
            {"d1", "p1"},
            id="prefill profile named by the handler",
        ),
        pytest.param(decided(None), set(), id="primary failed"),
        pytest.param(SchedulingResult({}, "default"), set(), id="no results"),
    ],
)
def test_pre_request_learns_primary_and_prefill_targets(result, learned):
    plugin = scorer(blockSizeTokens=1)
    req = completion("m", "aaaabbbb")
    plugin.pre_request(req, result)
    assert set(plugin.producer.index.servers()) == learned
    for name in learned:
        assert plugin.producer.index.server_size(name) == 2


def test_per_request_state_does_not_outlive_pre_request():
    plugin = scorer(blockSizeTokens=1)
    pod = endpoint("pod1")
    req = completion("m", "aaaabbbb")
    score(plugin, req, [pod])
    assert plugin.producer.state_key in req.derived
    plugin.pre_request(req, decided(pod))
    assert plugin.producer.state_key not in req.derived
    fresh = scorer(blockSizeTokens=1)
    assert set(vars(plugin.producer)) == set(vars(fresh.producer)), "no per-request fields on the producer"
    assert set(vars(plugin.scorer)) == set(vars(fresh.scorer)), "nor on the scorer"


def test_pre_request_uses_the_geometry_it_scored_with():
    """Block size came from the first candidate; pre_request must index the same hashes even if
    the target reports another block size."""
    plugin = scorer()
    first = endpoint("a", cache_block_size=4)
    target = endpoint("b", cache_block_size=32)
    req = completion("m", "x" * 256)
    score(plugin, req, [first, target])
    plugin.pre_request(req, decided(target))
    assert plugin.producer.index.server_size("b") == 16  # 256 chars / (4 tokens x 4)


def test_pre_request_without_scoring_here_hashes_the_request():
    """In the Ray path the deciding process may not be the one that scored: the request (or its
    shipped hashes) is enough."""
    plugin = scorer(blockSizeTokens=1)
    req = completion("m", "aaaabbbb")
    plugin.pre_request(req, decided(endpoint("pod1")))
    _, infos = score(plugin, completion("m", "aaaabbbbcc"), [endpoint("pod1")])
    assert infos["pod1"] == PrefixCacheMatchInfo(2, 3, 1)


def test_shared_instance_matches_once_per_cycle():
    """One instance in two profiles of a cycle: the second profile reuses the first's match."""
    plugin = scorer(blockSizeTokens=1)
    plugin.pre_request(completion("m", "aaaabbbb"), decided(endpoint("pod1")))
    state = CycleState()
    req = completion("m", "aaaabbbb")
    first = plugin.score(state, req, [endpoint("pod1")])
    plugin.producer.index.remove_server("pod1")  # a second match would now find nothing
    second = plugin.score(state, req, [endpoint("pod1"), endpoint("pod2")])
    assert list(first.values()) == [1.0]
    assert sorted(second.values()) == [0.0, 1.0]
    fresh = plugin.score(CycleState(), req, [endpoint("pod1")])  # a new cycle matches again
    assert list(fresh.values()) == [0.0]


def test_forget_servers_not_in():
    plugin = scorer(blockSizeTokens=1)
    for name in ("pod1", "pod2", "pod3"):
        plugin.pre_request(completion("m", f"{name}-prompt"), decided(endpoint(name)))
    assert plugin.producer.forget_servers_not_in(["pod1", "pod3", "pod9"]) == ["pod2"]
    assert sorted(plugin.producer.index.servers()) == ["pod1", "pod3"]
    assert plugin.producer.index.match(hash_prompt("pod2-prompt", "m", 1, 256)) == {}


def test_servers_unseen_for_a_whole_interval_are_forgotten():
    plugin = scorer(blockSizeTokens=1)
    pods = {name: endpoint(name) for name in ("pod1", "pod2", "pod3")}
    for pod in pods.values():
        plugin.pre_request(completion("m", f"{pod.name}-prompt"), decided(pod))
    req = completion("m", "aaaa")

    now = [0.0]
    plugin.producer.clock = lambda: now[0]

    def new_interval():
        now[0] += plugin.producer.inactive_check_seconds

    plugin.score(CycleState(), req, [pods["pod1"]])  # the first call starts the clock
    new_interval()
    plugin.score(CycleState(), req, [pods["pod1"]])  # starts an interval watching all three
    # pod2 appears in one call (another profile's candidates), pod3 never
    plugin.score(CycleState(), req, [pods["pod1"]])
    plugin.score(CycleState(), req, [pods["pod2"]])
    new_interval()
    plugin.score(CycleState(), req, [pods["pod1"]])
    assert sorted(plugin.producer.index.servers()) == ["pod1", "pod2"]

    # a decision naming pod2 counts as seeing it
    plugin.pre_request(completion("m", "pod2-prompt"), decided(pods["pod2"]))
    new_interval()
    plugin.score(CycleState(), req, [pods["pod1"]])
    assert sorted(plugin.producer.index.servers()) == ["pod1", "pod2"]
    new_interval()  # pod2 unseen through the last interval
    plugin.score(CycleState(), req, [pods["pod1"]])
    assert plugin.producer.index.servers() == ["pod1"]


def test_servers_are_kept_until_the_interval_ends():
    plugin = scorer(blockSizeTokens=1)
    plugin.pre_request(completion("m", "pod1-prompt"), decided(endpoint("pod1")))
    for _ in range(5):
        plugin.score(CycleState(), completion("m", "aaaa"), [endpoint("other")])
    assert plugin.producer.index.servers() == ["pod1"]


def test_hashes_shipped_instead_of_the_prompt():
    """The gateway hashes with the scorer's geometry and sends a request without its prompt."""
    plugin = scorer(blockSizeTokens=1)
    pod = endpoint("pod1", cache_block_size=2)
    plugin.pre_request(completion("m", "a" * 64), decided(pod))
    block_size, max_blocks = plugin.producer.geometry([pod])
    assert (block_size, max_blocks) == (2, 256)
    bare = LLMRequest("r2", "m", body={})
    set_prefix_block_hashes(bare, block_size, max_blocks, hash_prompt("a" * 64 + "b" * 8, "m", 2, 256))
    _, infos = score(plugin, bare, [pod])
    assert infos["pod1"] == PrefixCacheMatchInfo(8, 9, 2)
