"""`no-hit-lru-scorer` (llm-d's pkg/epp/framework/plugins/scheduling/scorer/nohitlru/no_hit_lru.go):
spread requests that hit no cached prefix anywhere ("cold" requests, which grow new KV blocks) over
the endpoints that took a cold request least recently.

A request is cold when the prefix-cache producer finds no matched block on any candidate. Cold:
endpoints never given a cold request score highest (1 - i/(n-1) in candidate order), then the
least recently used; a rank is the number of never-used candidates plus the endpoint's position in
the LRU (oldest first, over every endpoint tracked, clamped at 0), scored 1 - rank/(n-1); a lone
candidate scores 1. Warm: every candidate scores 0.5, leaving the choice to prefix affinity.
PreRequest moves a cold request's primary target, and its `prefill` target, to the LRU's newest
end; `lruSize` bounds how many endpoints it tracks.

The producer: `prefixMatchInfoProducerName` (an approx-prefix-cache-producer); else the producer of
the prefix-cache-scorer called `prefixPluginName` (default `prefix-cache-scorer`, of type
`prefixPluginType`), which also covers GIE's combined form; else the plugin called
`approx-prefix-cache-producer`. llm-d requires the data, so a config with none is a load-time error.
It reads the match the producer wrote for this cycle (a consumer of its key), so where this scorer
sits in the profile does not matter.
State is per plugin instance: in the Ray path, per profile actor, each told every decision."""

from __future__ import annotations

from collections import OrderedDict

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey
from scheduler.interfaces import Parameters, PluginHandle, PreRequest, Scorer, ScorerCategory
from scheduler.plugins.scorers.prefix_cache import PrefixCacheScorer
from scheduler.plugins.support.prefix.match_info import PrefixCacheMatchInfo, prefix_match_key
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

PREFILL_PROFILE = "prefill"  # llm-d's default prefill profile name, also updated by PreRequest
# Requests scored but never told a decision (failed, or another replica's) are forgotten oldest first.
MAX_PENDING = 10_000


class NoHitLRUParameters(Parameters):
    prefix_plugin_type: str = Field(default="prefix-cache-scorer", alias="prefixPluginType")
    prefix_plugin_name: str = Field(default="prefix-cache-scorer", alias="prefixPluginName")
    lru_size: int = Field(default=1024, alias="lruSize")  # <= 0 takes the default, as in llm-d
    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")


def find_prefix_match_key(
    handle: PluginHandle,
    producer_name: str = "",
    prefix_plugin_name: str = "prefix-cache-scorer",
    prefix_plugin_type: str = "prefix-cache-scorer",
) -> DataKey[dict[str, PrefixCacheMatchInfo]]:
    """The prefix-cache match a plugin reads: that of the producer called `producer_name`; else the
    one the prefix-cache-scorer called `prefix_plugin_name` reads; else llm-d's default producer's
    (`approx-prefix-cache-producer`): a config with none fails its build, naming this plugin."""
    if producer_name:
        return prefix_match_key(handle, producer_name)
    if prefix_plugin_name in handle.plugin_names():
        if prefix_plugin_type != PrefixCacheScorer.type_name:
            raise ValueError(f"prefixPluginType {prefix_plugin_type!r}: only prefix-cache-scorer is read here")
        return handle.plugin_of_type(prefix_plugin_name, PrefixCacheScorer, "prefixPluginName").match_key
    return prefix_match_key(handle, "")


@register
class NoHitLRUScorer(Scorer, PreRequest):
    type_name = "no-hit-lru-scorer"
    category = ScorerCategory.DISTRIBUTION
    Parameters = NoHitLRUParameters

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        self.lru_size = p.lru_size if p.lru_size > 0 else 1024
        self.lru: OrderedDict[str, None] = OrderedDict()  # endpoint names, least recently used first
        self._cold: OrderedDict[str, bool] = OrderedDict()  # request id -> cold, until its PreRequest
        self.match_key = find_prefix_match_key(
            handle, p.prefix_match_info_producer_name, p.prefix_plugin_name, p.prefix_plugin_type
        )
        self.consumes = (self.match_key,)

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        infos = cycle_state.get(self.match_key, {})
        cold = not any((info := infos.get(ep.name)) is not None and info.match_blocks > 0 for ep in endpoints)
        self._cold[request.request_id] = cold
        self._cold.move_to_end(request.request_id)
        while len(self._cold) > MAX_PENDING:
            self._cold.popitem(last=False)
        if not cold:
            return dict.fromkeys(endpoints, 0.5)
        n = len(endpoints)
        if n == 1:
            return {endpoints[0]: 1.0}
        position = {name: i for i, name in enumerate(self.lru)}
        never = [ep for ep in endpoints if ep.name not in position]
        scores = {ep: 1.0 - i / (n - 1) for i, ep in enumerate(never)}
        for ep in endpoints:
            if ep.name in position:
                scores[ep] = max(0.0, 1.0 - (len(never) + position[ep.name]) / (n - 1))
        return scores

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        if not self._cold.pop(request.request_id, False):
            return  # warm, or not scored by this instance
        for profile in (result.primary_profile_name, PREFILL_PROFILE):
            run = result.profile_results.get(profile)
            if run is not None and run.target_endpoints:
                self._use(run.target_endpoints[0].name)

    def _use(self, name: str) -> None:
        self.lru[name] = None
        self.lru.move_to_end(name)
        while len(self.lru) > self.lru_size:
            self.lru.popitem(last=False)
