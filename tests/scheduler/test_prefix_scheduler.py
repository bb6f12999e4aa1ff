"""The prefix-cache scorer end to end through `Scheduler.from_config` with GIE's default config
(ray_epp/configs/gie-default.yaml: queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3), and
Ray EPP's default (ray_epp/configs/default.yaml: the same with load-aware-scorer 4 for the queue scorer,
plus prefill-eta-scorer 4 and prefix-home-balance-scorer 2, behind the sticky filter)."""

from pathlib import Path

import pytest
import yaml

from scheduler import Scheduler, load_config_file
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY
from tests.scheduler.helpers import endpoint, request

CONFIGS = Path(__file__).resolve().parents[2] / "ray_epp" / "configs"
DEFAULT_CONFIG = CONFIGS / "gie-default.yaml"


def without_prefix_scorer() -> dict:
    """ray_epp/configs/gie-default.yaml with prefix-cache-scorer taken out."""
    cfg = yaml.safe_load(DEFAULT_CONFIG.read_text())
    cfg["plugins"] = [p for p in cfg["plugins"] if p["type"] != "prefix-cache-scorer"]
    for profile in cfg["schedulingProfiles"]:
        profile["plugins"] = [r for r in profile["plugins"] if r["pluginRef"] != "prefix-cache-scorer"]
    return cfg


def shared_prefix(group: int) -> str:
    return f"system prompt {group}: " + "You are a careful assistant. " * 120  # ~3.5 KB


def pods(n=4, **metrics):
    return [endpoint(f"pod{i}", **metrics) for i in range(n)]


def weights_in(path: Path) -> dict[str, float | None]:
    (profile,) = load_config_file(path).scheduling_profiles
    return {ref.plugin_ref: ref.weight for ref in profile.plugins}


def test_gie_default_config_is_gies_default():
    assert weights_in(DEFAULT_CONFIG) == {
        "queue-scorer": 2,
        "kv-cache-utilization-scorer": 2,
        "prefix-cache-scorer": 3,
        "max-score-picker": None,
    }


def test_ray_epp_default_is_gies_with_the_queue_against_a_line_plus_the_ledger_and_home_balance_behind_the_filter():
    assert weights_in(CONFIGS / "default.yaml") == {
        "prefix-cache-affinity-filter": None,
        "load-aware-scorer": 4,
        "kv-cache-utilization-scorer": 2,
        "prefix-cache-scorer": 3,
        "prefill-eta-scorer": 4,
        "prefix-home-balance-scorer": 2,
        "max-score-picker": None,
    }


def test_ray_epp_default_follows_a_prefix_once_its_first_token_arrived():
    sched = Scheduler.from_config(load_config_file(CONFIGS / "default.yaml"))
    eps = pods(4, waiting_queue_size=1, kv_cache_usage_percent=0.3)
    for g in range(10):
        first = request(prompt=shared_prefix(g) + "first question?", request_id=f"a{g}")
        home = sched.schedule(first, eps).target.name
        sched.response_first_token(first, home)
        second = sched.schedule(request(prompt=shared_prefix(g) + "another one!", request_id=f"b{g}"), eps)
        assert second.target.name == home
        sched.response_complete(request(request_id=f"b{g}"), home)


def follow_up_targets(sched: Scheduler, groups: int = 20) -> list[tuple[str, str]]:
    eps = pods(4, waiting_queue_size=1, kv_cache_usage_percent=0.3)
    pairs = []
    for g in range(groups):
        first = sched.schedule(request(prompt=shared_prefix(g) + "first question?", request_id=f"a{g}"), eps)
        second = sched.schedule(request(prompt=shared_prefix(g) + "another one!", request_id=f"b{g}"), eps)
        pairs.append((first.target.name, second.target.name))
    return pairs


def test_a_shared_prefix_goes_back_to_the_same_pod():
    sched = Scheduler.from_config(load_config_file(DEFAULT_CONFIG))
    pairs = follow_up_targets(sched)
    assert all(a == b for a, b in pairs), pairs
    # and the groups spread (ties among equal pods are random), so it is the prefix that decides
    assert len({a for a, _ in pairs}) > 1


def test_without_the_prefix_scorer_follow_ups_land_anywhere():
    """The control: the same traffic without prefix-cache-scorer returns to the first pod only by
    chance (1 in 4 per group)."""
    pairs = follow_up_targets(Scheduler.from_config(without_prefix_scorer()))
    assert not all(a == b for a, b in pairs)


def test_the_target_carries_its_match_info():
    sched = Scheduler.from_config(load_config_file(DEFAULT_CONFIG))
    eps = pods(3)
    first = sched.schedule(request(prompt=shared_prefix(0) + "q1"), eps)
    info = first.target.attributes[PREFIX_MATCH_KEY]
    assert info.match_blocks == 0 and info.total_blocks > 50
    second = sched.schedule(request(prompt=shared_prefix(0) + "q2"), eps)
    info2 = second.target.attributes[PREFIX_MATCH_KEY]
    assert second.target.name == first.target.name
    assert info2.total_blocks == info.total_blocks and info2.match_blocks == info.total_blocks - 1


@pytest.mark.parametrize(
    ("shared_fraction", "goes_back"),
    [
        pytest.param(0.9, True, id="90% cached beats the shortest queue"),
        pytest.param(0.5, False, id="50% cached does not"),
    ],
)
def test_prefix_weight_against_queue_weight(shared_fraction, goes_back):
    """With weights 2/2/3 and equal KV use, the pod with the longest queue wins only when it holds
    more than 2/3 of the prompt: 3 x match > 2 x (queue score difference of 1)."""
    sched = Scheduler.from_config(load_config_file(DEFAULT_CONFIG))
    warm = [endpoint("pod0")]
    prompt = "".join(f"block {i:04d} of the prompt text. " for i in range(100))  # 3,000 chars
    cut = int(len(prompt) * shared_fraction)
    assert sched.schedule(request(prompt=prompt[:cut]), warm).target.name == "pod0"
    eps = [endpoint("pod0", waiting_queue_size=8), endpoint("pod1", waiting_queue_size=0)]
    eps += [endpoint(f"pod{i}", waiting_queue_size=4) for i in (2, 3)]
    target = sched.schedule(request(prompt=prompt), eps).target.name
    assert (target == "pod0") is goes_back, target
