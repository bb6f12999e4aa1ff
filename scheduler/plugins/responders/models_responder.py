"""`models-responder`: the pool's `GET /v1/models`, and the screen that keeps a request on the
endpoints that serve its model (llm-d-router's requestcontrol/responder/models, an Alpha plugin).

What it reads. Each endpoint's own `/v1/models` list (`Endpoint.served_models`: base models, and
LoRA adapters with their `parent`), which the metrics actors fetch from every pod every
`models_refresh_s` (10 s) and the datastore puts in its snapshots; llm-d's plugin auto-creates a
`models-data-source` and `models-data-extractor` for the same list, and here the collection is
always on. An adapter a pod's metrics list as running or waiting (vLLM's `vllm:lora_requests_info`,
scraped every 50 ms) counts as listed there too, so an adapter loaded since the last list is not
screened away from the pod that is running it; llm-d reads the list alone.

`respond`: the union of the endpoints' lists, one entry per id (the first endpoint by name wins a
duplicate), sorted by id, each with the fields the server reported (`id`, `object`, `created`,
`owned_by`, `parent` for an adapter, `shutdown_date`); 503 while no endpoint's list is collected,
so a client retries instead of caching an empty list. Anything but `GET /v1/models` (a trailing
slash allowed) is declined.

`screen`, llm-d's rule: a request for a base model goes to the endpoints that list it and those not
yet collected; for an adapter, only to the endpoints that list it; when none lists the model, to
the endpoints not yet collected, or to all of them if every list is collected (a list may be
incomplete; the model server then answers for itself)."""

from __future__ import annotations

from scheduler.interfaces import LocalResponse, Responder, Screener
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

MODELS_PATH = "/v1/models"
NOT_COLLECTED = "no model data collected yet from any endpoint"


def lists_model(endpoint: Endpoint, model: str) -> tuple[bool, bool] | None:
    """(listed, as an adapter) for `model` on `endpoint`; None when its list is not collected and
    its metrics do not show the adapter running."""
    m = endpoint.metrics
    if model in m.active_models or model in m.waiting_models:
        return True, True
    served = endpoint.served_models
    if served is None:
        return None
    for entry in served:
        if entry.id == model:
            return True, entry.is_adapter
    return False, False


@register
class ModelsResponder(Responder, Screener):
    type_name = "models-responder"

    def respond(self, method: str, path: str, endpoints: list[Endpoint]) -> LocalResponse | None:
        if method != "GET" or path.split("?", 1)[0].rstrip("/") != MODELS_PATH:
            return None
        seen: dict[str, dict] = {}
        collected = 0
        for ep in sorted(endpoints, key=lambda e: e.name):
            if ep.served_models is None:
                continue  # not collected yet
            collected += 1
            for entry in ep.served_models:
                seen.setdefault(entry.id, entry.to_json())
        if not collected:
            return LocalResponse(503, NOT_COLLECTED)
        return LocalResponse(200, {"object": "list", "data": [seen[k] for k in sorted(seen)]})

    def screen(self, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        model = request.target_model
        if not model:
            return endpoints
        serving: list[Endpoint] = []
        unlisted: list[Endpoint] = []
        adapter = False
        for ep in endpoints:
            found = lists_model(ep, model)
            if found is None:
                unlisted.append(ep)
            elif found[0]:
                serving.append(ep)
                adapter = adapter or found[1]
        if serving:
            return serving if adapter else serving + unlisted
        return unlisted or endpoints
