"""`openai-parser` (llm-d's pkg/epp/framework/plugins/requesthandling/parsers/openai): reads
OpenAI-format request bodies. Ray EPP's gateway is that parser, for the routes it serves
(/v1/completions and /v1/chat/completions: prompt or messages, model, stream, usage), so this plugin
has no role of its own: it exists so `requestHandler.parsers: [{pluginRef: openai-parser}]` (or the
deprecated top-level `parser`) loads as llm-d writes it. llm-d's other OpenAI routes
(conversations, responses, embeddings, images) are not served by the gateway."""

from __future__ import annotations

from scheduler.interfaces import Plugin
from scheduler.registry import register


@register
class OpenAIParser(Plugin):
    type_name = "openai-parser"
