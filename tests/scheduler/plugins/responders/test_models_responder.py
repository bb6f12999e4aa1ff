"""`models-responder` in process: llm-d's README config loads and schedules, the screen keeps a
request on the endpoints that serve its model by llm-d's rules, and the pool's /v1/models is the
union of the endpoints' own lists (503 while none is collected)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import Endpoint, Metrics, Scheduler, SchedulingTrace, ServedModel
from scheduler.config import load_config, load_config_file
from scheduler.errors import ConfigError
from scheduler.plugins.responders.models_responder import ModelsResponder
from tests.scheduler.helpers import request

README_CONFIG = Path(__file__).parents[3] / "fixtures" / "llm-d" / "readme" / "models-responder.yaml"
BASE = "meta-llama/Llama-3.1-8B-Instruct"


def pod(name: str, *listed: str | dict, running: tuple[str, ...] = (), collected: bool = True) -> Endpoint:
    """An endpoint whose /v1/models lists `listed` (an id with a ':' is an adapter of BASE)."""
    models = [m if isinstance(m, dict) else {"id": m, "parent": BASE if ":" in m else None} for m in listed]
    return Endpoint(
        name, port=8000 + len(name), metrics=Metrics(active_models=list(running)),
        served_models=models if collected else None,
    )  # fmt: skip


def picks(scheduler: Scheduler, model: str, endpoints: list[Endpoint], n: int = 40) -> set[str]:
    return {scheduler.schedule(request(model, request_id=f"r{i}"), endpoints).target.name for i in range(n)}


@pytest.fixture(scope="module")
def scheduler() -> Scheduler:
    assert README_CONFIG.read_text().startswith("# Source: github.com/llm-d/llm-d-router pkg/epp/")
    return Scheduler.from_config(load_config_file(README_CONFIG))


def test_the_readme_config_loads_with_the_plugin_screening_every_profile(scheduler):
    (profile,) = scheduler.profiles.values()
    assert [type(s) for s in profile.screeners] == [ModelsResponder]


def test_an_adapter_goes_only_to_the_endpoints_that_list_it(scheduler):
    pool = [pod("a", BASE, "sql:lora"), pod("b", BASE), pod("c", collected=False)]
    assert picks(scheduler, "sql:lora", pool) == {"a"}  # not the uncollected one: it may lack the adapter


def test_a_base_model_goes_to_its_listers_and_the_uncollected(scheduler):
    pool = [pod("a", BASE), pod("b", "other-model"), pod("c", collected=False)]
    assert picks(scheduler, BASE, pool) == {"a", "c"}


def test_a_model_no_one_lists_goes_to_the_uncollected_else_to_everyone(scheduler):
    assert picks(scheduler, "unknown", [pod("a", BASE), pod("b", collected=False)]) == {"b"}
    assert picks(scheduler, "unknown", [pod("a", BASE), pod("b", BASE)]) == {"a", "b"}


def test_an_adapter_the_metrics_show_running_counts_as_listed(scheduler):
    # loaded since the pod's list was last collected: vllm:lora_requests_info already shows it
    pool = [pod("a", BASE, "sql:lora"), pod("b", BASE, running=("sql:lora",)), pod("c", BASE)]
    assert picks(scheduler, "sql:lora", pool) == {"a", "b"}


def test_the_screen_is_in_the_trace_before_the_filters(scheduler):
    trace = SchedulingTrace()
    scheduler.schedule(request("sql:lora"), [pod("a", BASE, "sql:lora"), pod("b", BASE)], trace)
    (profile,) = trace.profiles.values()
    assert profile["filters"][0]["plugin"] == "models-responder"
    assert profile["filters"][0]["removed"] == ["b"]


def test_v1_models_is_the_union_with_the_servers_fields():
    responder = ModelsResponder()
    a = {"id": BASE, "object": "model", "created": 1700000000, "owned_by": "vllm"}
    pool = [pod("b", a, "chat:lora"), pod("a", {**a, "owned_by": "first"}, "sql:lora"), pod("c", collected=False)]
    answer = responder.respond("GET", "/v1/models", pool)
    assert answer is not None and answer.status == 200
    assert answer.body == {
        "object": "list",
        "data": [
            {"id": "chat:lora", "object": "model", "parent": BASE},  # sorted by id
            {"id": BASE, "object": "model", "created": 1700000000, "owned_by": "first"},  # endpoint "a" wins
            {"id": "sql:lora", "object": "model", "parent": BASE},
        ],
    }
    assert responder.respond("GET", "/v1/models/?x=1", pool).body == answer.body


def test_v1_models_is_503_until_a_list_is_collected_and_other_requests_are_declined():
    responder = ModelsResponder()
    answer = responder.respond("GET", "/v1/models", [pod("a", collected=False)])
    assert answer is not None and answer.status == 503
    assert responder.respond("GET", "/v1/models", []).status == 503
    assert responder.respond("POST", "/v1/models", [pod("a", BASE)]) is None
    assert responder.respond("GET", "/v1/completions", [pod("a", BASE)]) is None


def test_an_empty_collected_list_counts_as_collected():
    answer = ModelsResponder().respond("GET", "/v1/models", [pod("a")])
    assert answer is not None and (answer.status, answer.body) == (200, {"object": "list", "data": []})


def test_a_models_data_source_is_still_refused_naming_it():
    text = "plugins:\n- type: models-responder\n- type: models-data-source\n  parameters:\n    scheme: https\n"
    with pytest.raises(ConfigError, match="models-data-source"):
        load_config(text)


def test_served_models_from_json_keep_what_the_server_said():
    m = ServedModel.from_json({"id": "x", "parent": BASE, "created": 5, "owned_by": "vllm", "root": "/p"})
    assert (m.id, m.parent, m.created, m.owned_by, m.is_adapter) == ("x", BASE, 5, "vllm", True)
    assert m == ServedModel("x", BASE, "vllm", created=6)  # vLLM stamps each answer: not compared
    assert Endpoint.from_json({"name": "e", "served_models": ["x"]}).served_models == (ServedModel("x"),)
    with pytest.raises(ValueError):
        ServedModel.from_json({"id": 3})
