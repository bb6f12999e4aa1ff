"""`inflight-load-producer` (llm-d's pkg/epp/framework/plugins/requestcontrol/dataproducer/
inflightload): how in-flight requests and tokens are counted for `token-load-scorer` and
`concurrency-detector` (scheduler/plugins/support/inflight_load_count.py has the rules).

llm-d keeps one count that its consumers read; here each consumer keeps its own count with this
producer's parameters, because in the Ray path the consumers live in different processes (a profile
actor, a gateway replica). llm-d creates the producer with its defaults when a consumer needs it and
none is configured; so does Ray EPP."""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import Field

from scheduler.body_fields import OUTPUT_LIMIT_FIELDS, PROMPT_FIELDS
from scheduler.interfaces import Parameters, Plugin, PluginHandle
from scheduler.plugins.support.inflight_load_count import InFlightLoad, LoadEstimate
from scheduler.registry import register


class InFlightLoadProducerParameters(Parameters):
    add_estimated_output_tokens: bool = Field(default=False, alias="addEstimatedOutputTokens")
    output_ratio: float = Field(default=1.5, alias="outputRatio", ge=0.0)
    max_estimated_output_tokens: int | None = Field(default=None, alias="maxEstimatedOutputTokens", ge=0)


@register
class InFlightLoadProducer(Plugin):
    type_name = "inflight-load-producer"
    body_fields = PROMPT_FIELDS | frozenset(OUTPUT_LIMIT_FIELDS)  # what its counts estimate by
    Parameters = InFlightLoadProducerParameters

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        self.estimate = LoadEstimate(p.add_estimated_output_tokens, p.output_ratio, p.max_estimated_output_tokens)

    def new_count(self, clock: Callable[[], float] = time.monotonic) -> InFlightLoad:
        """A consumer's own count, on the consumer's clock."""
        return InFlightLoad(self.estimate, clock)


def inflight_load_for(handle: PluginHandle) -> InFlightLoad:
    """A consumer's own count, with the parameters of the producer called `inflight-load-producer`
    (the name a plugin of that type gets by default), or llm-d's defaults when there is none."""
    name = InFlightLoadProducer.type_name
    if name not in handle.plugin_names():
        return InFlightLoadProducer().new_count(handle.clock)
    return handle.plugin_of_type(name, InFlightLoadProducer, "the plugin called").new_count(handle.clock)
