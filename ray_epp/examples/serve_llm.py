"""Ray Serve LLM with Ray EPP as its request router: an OpenAI app (`build_openai_app`) whose LLM
deployment routes every request with `EPPRequestRouter` (serve_app/llm_router/router.py).

Needs a GPU machine with `pip install "ray[llm]"` and this project installed on every node (the
replicas import `serve_app`; docs/INSTALL.md):

    python -m ray_epp.examples.serve_llm                         # Qwen2.5-0.5B, 2 replicas, port 8000
    python -m ray_epp.examples.serve_llm --replicas 4 --config lora
    python -m ray_epp.examples.serve_llm --config my-epp.yaml    # read here, sent to the replicas as YAML
    python -m ray_epp.examples.serve_llm --lora-path s3://my-bucket/loras   # LoRA adapters, as multiplexed models
    curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"model": "qwen-0.5b", "messages": [{"role": "user", "content": "Hello"}]}'

`bench/serve_llm_smoke.py` starts this app, sends 20 requests and prints where they went.
The same app as a Serve config file: serve_llm.yaml beside this file (`epp examples DIR` copies both).

Only `build_app` needs `ray[llm]`; the router's settings (`router_config`) are plain Serve and are
checked by tests/serve_app/test_serve_llm_example.py on a machine without it.
"""

from __future__ import annotations

import argparse
from typing import Any

from ray.serve.config import RequestRouterConfig

MODEL_ID = "qwen-0.5b"
MODEL_SOURCE = "Qwen/Qwen2.5-0.5B-Instruct"
ROUTER_CLASS = "serve_app.llm_router:EPPRequestRouter"
SERVER_CLASS = "serve_app.llm_router.server:EPPLLMServer"  # LLMServer + its load in record_routing_stats


def router_config(config: str = "default", stats_period_s: float = 0.5) -> RequestRouterConfig:
    """EPPRequestRouter with an EndpointPickerConfig: a shipped config's name, YAML text, or a path
    (relative to this process's working directory), read here so that no replica needs the file."""
    from serve_app.llm_router.router_config import portable_config

    return RequestRouterConfig(
        request_router_class=ROUTER_CLASS,
        request_router_kwargs={"config": portable_config(config)},
        request_routing_stats_period_s=stats_period_s,  # how fresh the replicas' published load is
        request_routing_stats_timeout_s=2.0,
    )


def llm_config_dict(
    model_id: str = MODEL_ID,
    model_source: str = MODEL_SOURCE,
    replicas: int = 2,
    config: str = "default",
    lora_path: str | None = None,
    publish_stats: bool = True,
    accelerator_type: str | None = None,
) -> dict[str, Any]:
    """The `LLMConfig` fields, as a dict (what a Serve config file's `llm_configs` entry holds)."""
    engine_kwargs: dict[str, Any] = {"max_model_len": 8192, "enable_prefix_caching": True}
    out: dict[str, Any] = {
        "model_loading_config": {"model_id": model_id, "model_source": model_source},
        "engine_kwargs": engine_kwargs,
        "deployment_config": {
            "num_replicas": replicas,
            "request_router_config": router_config(config).model_dump(),
        },
    }
    if accelerator_type:
        out["accelerator_type"] = accelerator_type
    if lora_path:
        out["lora_config"] = {"dynamic_lora_loading_path": lora_path, "max_num_adapters_per_replica": 4}
        engine_kwargs.update(enable_lora=True, max_loras=4, max_lora_rank=64)
    if publish_stats:
        out["server_cls"] = SERVER_CLASS
    return out


def build_app(**kwargs: Any) -> Any:
    """The OpenAI app (needs `ray[llm]`): `/v1/chat/completions`, `/v1/completions`, `/v1/models`."""
    from ray.serve.llm import LLMConfig, build_openai_app

    return build_openai_app({"llm_configs": [LLMConfig(**llm_config_dict(**kwargs))]})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Ray Serve LLM with EPPRequestRouter")
    ap.add_argument("--model-id", default=MODEL_ID)
    ap.add_argument("--model-source", default=MODEL_SOURCE)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--config", default="default", help="the router's EndpointPickerConfig: a name, path or YAML")
    ap.add_argument("--lora-path", help="cloud path of LoRA adapters (s3://, gs://, abfss://)")
    ap.add_argument("--no-publish-stats", action="store_true", help="plain LLMServer (Serve's queue lengths only)")
    ap.add_argument("--accelerator-type", help="e.g. A10G, L4, H100")
    ap.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to serve beyond this machine")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    from ray import serve

    serve.start(http_options={"host": args.host, "port": args.port})
    app = build_app(
        model_id=args.model_id, model_source=args.model_source, replicas=args.replicas, config=args.config,
        lora_path=args.lora_path, publish_stats=not args.no_publish_stats, accelerator_type=args.accelerator_type,
    )  # fmt: skip
    serve.run(app, blocking=True)


if __name__ == "__main__":
    main()
