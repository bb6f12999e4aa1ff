"""P/D in one round (`parallelStages`) decides exactly as the sequential rounds: the same request
stream through two in-process Schedulers built from ray_epp/configs/pd.yaml (plus prefill-backlog-scorer,
whose ledger is the other stateful plugin) gives the same decisions, the same prefix index and the
same ledger, while the one-round scheduler really runs prefill beside decode and discards it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from scheduler import CycleState, Endpoint, LLMRequest, Metrics, Scheduler, SchedulingError, load_config
from scheduler.interfaces import PDDecider
from scheduler.loop import CONCURRENT_ROUNDS_KEY
from scheduler.plugins.handlers.disagg import RAN_WITH_DECODE
from scheduler.plugins.producers.approx_prefix import ApproxPrefixCacheProducer
from scheduler.plugins.scorers.prefill_backlog import PrefillBacklogScorer
from scheduler.registry import register
from scheduler.trace import SchedulingTrace
from scheduler.types import ProfileRunResult, SchedulingResult

PD_YAML = Path(__file__).resolve().parents[2] / "ray_epp" / "configs" / "pd.yaml"
ROLE = "llm-d.ai/role"


def pd_config(parallel: bool | str, decider: str = "prefix-based-pd-decider") -> dict:
    cfg = yaml.safe_load(PD_YAML.read_text())
    cfg["plugins"].append({"type": "prefill-backlog-scorer"})
    for plugin in cfg["plugins"]:
        if plugin["type"] == "disagg-profile-handler":
            plugin["parameters"]["parallelStages"] = parallel
            plugin["parameters"]["deciders"]["prefill"] = decider
    for profile in cfg["schedulingProfiles"]:
        profile["plugins"].append({"pluginRef": "prefill-backlog-scorer", "weight": 1})
    return cfg


def make_scheduler(parallel: bool | str, **kw) -> Scheduler:
    s = Scheduler.from_config(load_config(pd_config(parallel, **kw)))
    for plugin in s.plugins.values():  # the same salts both ways: the same draws from the same seeds
        if hasattr(plugin, "rng_salt"):
            plugin.rng_salt = 12345
    return s


def pool(rng: random.Random, with_prefill: bool, with_decode: bool) -> list[Endpoint]:
    """3 prefill, 3 decode, 2 dual-role pods; queues often equal (ties: the picker draws)."""
    specs = []
    if with_prefill:
        specs += [(f"p{i}", "prefill") for i in range(3)]
    if with_decode:
        specs += [(f"d{i}", "decode") for i in range(3)]
    specs += [(f"b{i}", "prefill-decode") for i in range(2)] if with_prefill and with_decode else []
    return [
        Endpoint(n, "127.0.0.1", 8000, {ROLE: r}, Metrics(waiting_queue_size=rng.choice((0, 0, 0, 1, 2))))
        for n, r in specs
    ]


def stream(n: int, seed: int):
    """(request, endpoints, complete?) triples: short prompts, repeats of a few long documents
    (cached after the first time), long prompts that share a document and add a long new tail,
    and unique long prompts; now and then no prefill pod (prefill fails: decode-only) or no
    decode pod (the request fails)."""
    rng = random.Random(seed)
    docs = [" ".join(f"doc{d}w{i}" for i in range(120)) for d in range(6)]
    for i in range(n):
        kind = rng.random()
        if kind < 0.2:
            prompt = f"hi {i}"
        elif kind < 0.5:
            prompt = rng.choice(docs)
        elif kind < 0.7:
            prompt = rng.choice(docs) + " " + " ".join(f"t{i}x{j}" for j in range(rng.choice((2, 40))))
        else:
            prompt = " ".join(f"u{i}w{j}" for j in range(rng.choice((10, 60, 200))))
        r = rng.random()
        endpoints = pool(rng, with_prefill=r > 0.08, with_decode=r < 0.04 or r > 0.1)
        req = LLMRequest(request_id=f"r{i}", target_model="m", body={"model": "m", "prompt": prompt})
        yield req, endpoints, rng.random() < 0.5


def index_state(s: Scheduler) -> dict[str, list[int]]:
    (producer,) = [p for p in s.plugins.values() if isinstance(p, ApproxPrefixCacheProducer)]
    return {name: list(entry.lru) for name, entry in producer.index._servers.items()}


def ledger_state(s: Scheduler) -> dict[str, int]:
    (scorer,) = [p for p in s.plugins.values() if isinstance(p, PrefillBacklogScorer)]
    return dict(scorer.backlog())


def scheduled(result: SchedulingResult, trace: SchedulingTrace) -> tuple:
    """A decision as the two runs compare it: primary profile, each profile's targets (None: it
    ran and failed), and the handler's record without the list of what ran beside decode."""
    targets = {
        name: None if r is None else [ep.name for ep in r.target_endpoints]
        for name, r in result.profile_results.items()
    }
    record = dict(trace.extra.get("disagg", {}))
    record.pop(RAN_WITH_DECODE, None)
    return ("ok", result.primary_profile_name, targets, record)


def run(s: Scheduler, n: int = 300, seed: int = 7) -> tuple[list, list, list]:
    """Every request's outcome and decision record, and the ledger after each; rounds per request."""
    s.cycle_seeds.seed(99)
    outcomes, ledgers, rounds = [], [], []
    for req, endpoints, complete in stream(n, seed):
        trace = SchedulingTrace()
        try:
            result = s.schedule(req, endpoints, trace=trace)
        except SchedulingError as err:
            outcomes.append(("error", err.code, err.message, trace.extra.get("disagg")))
        else:
            outcomes.append(scheduled(result, trace))
            if complete:
                s.response_complete(req, result.profile_results[result.primary_profile_name].target_endpoints[0].name)
        rounds.append(trace.rounds)
        ledgers.append(ledger_state(s))
    return outcomes, ledgers, rounds


def test_one_round_decides_and_learns_exactly_as_sequential_rounds():
    sequential, one_round = make_scheduler(False), make_scheduler(True)
    seq_outcomes, seq_ledgers, seq_rounds = run(sequential)
    par_outcomes, par_ledgers, par_rounds = run(one_round)

    for i, (a, b) in enumerate(zip(seq_outcomes, par_outcomes, strict=True)):
        if a[0] == "error":  # the record of a failed decode differs only by what ran beside it
            assert b[0] == "error" and a[:3] == b[:3], i
        else:
            assert a == b, f"request r{i}: sequential {a} vs one round {b}"
    assert seq_ledgers == par_ledgers
    assert index_state(sequential) == index_state(one_round)

    # The stream covers every case, and one round really ran prefill beside decode.
    decisions = [o[3]["decision"] for o in seq_outcomes if o[0] == "ok"]
    assert decisions.count("prefill-decode") >= 30 and decisions.count("decode-only") >= 100
    assert sum(o[0] == "error" for o in seq_outcomes) >= 3
    assert any(o[0] == "ok" and o[2].get("prefill", 0) is None for o in seq_outcomes)  # prefill failed
    both = [r for r in par_rounds if r and len(r[0]) == 2]
    assert all(len(r) <= 1 for r in par_rounds)
    discarded = sum(
        1 for o, r in zip(par_outcomes, par_rounds, strict=True) if r and len(r[0]) == 2 and o[0] == "ok"
        and o[3].get("prefill") == "skipped"
    )  # fmt: skip
    assert len(both) >= 100 and discarded >= 30
    assert [len(r) for r in seq_rounds if r and len(r) == 2]  # sequential: prefill in a second round


def test_short_prompts_run_decode_alone_and_auto_follows_the_runner():
    s = make_scheduler("auto")
    handler = s.handler
    long_req = LLMRequest(request_id="a", target_model="m", body={"model": "m", "prompt": "word " * 200})
    short_req = LLMRequest(request_id="b", target_model="m", body={"model": "m", "prompt": "hi"})
    state = CycleState()
    assert list(handler.pick(state, long_req, s.profiles, {})) == ["decode"]  # in-process: sequential
    state.write(CONCURRENT_ROUNDS_KEY, True)  # what a concurrent runner (the Ray path's) makes the loop write
    assert list(handler.pick(state, long_req, s.profiles, {})) == ["decode", "prefill"]
    state = CycleState()
    state.write(CONCURRENT_ROUNDS_KEY, True)
    assert list(handler.pick(state, short_req, s.profiles, {})) == ["decode"]  # the decider can only say no


def test_a_failed_decode_discards_what_ran_beside_it():
    s = make_scheduler(True)
    req = LLMRequest(request_id="a", target_model="m", body={"model": "m", "prompt": "word " * 200})
    prefill_only = pool(random.Random(1), with_prefill=True, with_decode=False)
    trace = SchedulingTrace()
    with pytest.raises(SchedulingError, match="decode workers"):
        s.schedule(req, prefill_only, trace=trace)
    assert trace.rounds == [["decode", "prefill"]]
    assert index_state(s) == {} and ledger_state(s) == {}


@register
class NeedsPrefillRoundDecider(PDDecider):
    """A decider that needs more than a parallel round can give: its stage stays sequential."""

    type_name = "test-sequential-only-decider"
    parallel_round = False

    def disaggregate(self, cycle_state, request, decode_endpoint) -> bool:
        return True


def test_a_decider_that_needs_a_later_round_keeps_its_stage_sequential():
    cfg = pd_config(True, decider="seq-only")
    cfg["plugins"].append({"type": "test-sequential-only-decider", "name": "seq-only"})
    s = Scheduler.from_config(load_config(cfg))
    req = LLMRequest(request_id="a", target_model="m", body={"model": "m", "prompt": "word " * 200})
    trace = SchedulingTrace()
    result = s.schedule(req, pool(random.Random(1), True, True), trace=trace)
    assert trace.rounds == [["decode"], ["prefill"]]
    assert isinstance(result.profile_results["prefill"], ProfileRunResult)
