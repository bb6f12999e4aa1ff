"""`disagg-headers-handler` and its older name `prefill-header-handler` (llm-d, deprecated there):
PreRequest plugins that put the chosen prefill pod (and encode pods) into the request headers
`x-prefiller-host-port` / `x-encoder-hosts-ports` for the decode pod's sidecar.

Accepted so that older llm-d P/D configs load as written, and otherwise inert: here the gateway
hands the prefill target over itself, from the result's prefill profile
(`SchedulingResult.prefill_profile_name`, set by the disagg-profile-handler), whether or not one of
these is configured. Their parameters name the profiles as llm-d's did and are only checked."""

from __future__ import annotations

from pydantic import Field

from scheduler.interfaces import Parameters, PreRequest
from scheduler.registry import register
from scheduler.types import LLMRequest, SchedulingResult


class DisaggHeadersParameters(Parameters):
    prefill_profile: str = Field(default="prefill", alias="prefillProfile")
    encode_profile: str = Field(default="encode", alias="encodeProfile")


@register
class DisaggHeadersHandler(PreRequest):
    type_name = "disagg-headers-handler"
    Parameters = DisaggHeadersParameters

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        return None


@register
class PrefillHeaderHandler(DisaggHeadersHandler):
    type_name = "prefill-header-handler"
