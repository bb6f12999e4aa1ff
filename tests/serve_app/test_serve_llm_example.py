"""ray_epp/examples/serve_llm.py and ray_epp/examples/serve_llm.yaml without a GPU or `ray[llm]`: the router settings
are Serve's own and validate, the Python builder and the config file agree, and the replica-side
server class is importable by name (built only where Ray Serve LLM is)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import yaml
from ray.serve._private.config import DeploymentConfig
from ray.serve.config import RequestRouterConfig
from ray.serve.schema import ServeDeploySchema

from ray_epp.examples import serve_llm
from scheduler import EndpointPickerConfig
from serve_app.llm_router import server as llm_server
from serve_app.llm_router.router import EPPRequestRouter, read_config
from serve_app.llm_router.stats import EngineStatsMixin

ROOT = Path(__file__).resolve().parents[2]


def has_serve_llm() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None and importlib.import_module("ray.serve.llm") is not None
    except ImportError:
        return False


def test_router_config_is_serves_and_names_the_router():
    config = serve_llm.router_config()
    assert config.get_request_router_class() is EPPRequestRouter
    assert isinstance(read_config(config.request_router_kwargs["config"]), EndpointPickerConfig)
    # what LLMConfig's deployment_config validator runs
    deployment = serve_llm.llm_config_dict(replicas=3, lora_path="s3://bucket/loras")["deployment_config"]
    validated = DeploymentConfig(**deployment)
    assert validated.num_replicas == 3
    assert validated.request_router_config.request_router_class == serve_llm.ROUTER_CLASS


def test_a_bad_router_class_is_refused_by_serve():
    with pytest.raises(Exception, match="nowhere"):
        RequestRouterConfig(request_router_class="serve_app.nowhere:Router").get_request_router_class()


def test_the_config_file_builds_the_same_app_as_the_example():
    data = yaml.safe_load((ROOT / "ray_epp" / "examples" / "serve_llm.yaml").read_text())
    schema = ServeDeploySchema.model_validate(data)
    app = schema.applications[0]
    assert app.import_path == "ray.serve.llm:build_openai_app"
    (entry,) = app.args["llm_configs"]
    ours = serve_llm.llm_config_dict()
    assert entry["model_loading_config"] == ours["model_loading_config"]
    assert entry["server_cls"] == ours["server_cls"] == "serve_app.llm_router.server:EPPLLMServer"
    assert DeploymentConfig(**entry["deployment_config"]).request_router_config == DeploymentConfig(
        **ours["deployment_config"]
    ).request_router_config


def test_the_server_class_is_named_without_ray_llm_and_built_with_it():
    if has_serve_llm():
        from ray.serve.llm import LLMServer

        cls = llm_server.EPPLLMServer
        assert issubclass(cls, LLMServer) and issubclass(cls, EngineStatsMixin)
    else:  # a clear error that says what to install, not an AttributeError deep in Serve
        with pytest.raises(ImportError, match=r"ray\[llm\]"):
            llm_server.EPPLLMServer  # noqa: B018


def test_a_stream_counts_as_one_running_request_while_it_is_read():
    class Replica(EngineStatsMixin):
        epp_max_lora = 2

    replica = Replica()
    seen = []

    async def stream():
        for i in range(3):
            seen.append(replica.engine_state()["epp_engine"])
            yield i

    async def consume():
        return [x async for x in llm_server.tracked(replica, stream(), "lora-a")]

    assert asyncio.run(consume()) == [0, 1, 2]
    assert all(s["running"] == 1 and s["running_lora_adapters"] == ["lora-a"] for s in seen)
    assert replica.engine_state()["epp_engine"]["running"] == 0  # done: no longer counted


@pytest.mark.skipif(not has_serve_llm(), reason="needs ray[llm] (vLLM); checked on a GPU machine")
def test_llm_config_builds():  # pragma: no cover - GPU machines
    from ray.serve.llm import LLMConfig

    LLMConfig(**serve_llm.llm_config_dict())
