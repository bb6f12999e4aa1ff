"""`always-disagg-multimodal-decider` (llm-d): run the encode stage of E/P/D exactly for chat
requests that carry image, video or audio content blocks (vLLM's multimodal input types)."""

from __future__ import annotations

from typing import Any

from scheduler.cycle_state import CycleState
from scheduler.interfaces import PDDecider
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

MULTIMODAL_BLOCK_TYPES = frozenset({"image_url", "video_url", "input_audio"})


def has_multimodal_content(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            isinstance(block, dict) and block.get("type") in MULTIMODAL_BLOCK_TYPES for block in content
        ):
            return True
    return False


@register
class AlwaysDisaggMultimodalDecider(PDDecider):
    type_name = "always-disagg-multimodal-decider"
    body_fields = frozenset({"messages"})  # their content blocks

    def might_disaggregate(self, cycle_state: CycleState, request: LLMRequest) -> bool:
        return has_multimodal_content(request.body)

    def disaggregate(self, cycle_state: CycleState, request: LLMRequest, decode_endpoint: Endpoint) -> bool:
        return has_multimodal_content(request.body)
