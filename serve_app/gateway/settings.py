"""Gateway settings that are not scheduling config: limits, retries, objectives, P/D hand-off."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scheduler.config.nesting import MAX_FILE_NESTING, nests_deeper_than
from scheduler.config.placement import DecideIn


class GatewaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # Inference objectives by name -> priority (GIE's InferenceObjective): requests name one in the
    # `x-gateway-inference-objective` header. Priority < 0 is sheddable.
    objectives: dict[str, int] = Field(default_factory=dict)
    # A body over this is refused with 413: at once when its Content-Length says so, else as soon
    # as the bytes read pass it (a chunked body is never read whole first).
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    # JSON nested deeper than this is refused with 400 (checked without recursion): no request
    # may carry a value that parses but cannot be pickled to the profile actors.
    max_json_depth: int = Field(default=64, ge=2, le=512)
    # The request headers (names + values, bytes) over this are refused with 431 before forwarding.
    max_header_bytes: int = Field(default=32 * 1024, gt=0)
    # A client must send its whole body within this, else 408: a connection that declares a body
    # and then trickles (or stops) does not hold a request slot for ever.
    body_read_timeout_s: float = Field(default=30.0, gt=0)
    # Requests a replica serves at once (OpenAI routes and /v1/pick); past it, 503 with Retry-After
    # at once instead of queueing. Keep it below the deployment's max_ongoing_requests (2,048), so
    # /health, /ready and /metrics always have slots left.
    max_in_flight: int = Field(default=1536, gt=0)
    # Per client, at one replica (serve_app/gateway/client_limits.py): a client is the API key it presented
    # when `api_key` lists several, else its fairness id when `trust_fairness_id`, else its source
    # address (connections: always the source address). Over its share a client gets 429 +
    # Retry-After (a connection past its limit gets it instead of being served, then is closed),
    # so one client holding requests open, or bodies unfinished, leaves the rest of the replica to
    # the others. Behind a proxy every client has the proxy's address: identify clients by key or
    # trusted fairness id there, or raise these.
    client_max_in_flight: int = Field(default=1024, gt=0)
    # Bodies still being read (a well-behaved client's body arrives with its headers; one that
    # trickles holds its slot up to body_read_timeout_s).
    client_max_unfinished_bodies: int = Field(default=128, gt=0)
    client_max_connections: int = Field(default=1024, gt=0)
    # Whether the x-gateway-inference-fairness-id header names the client (only when a proxy in
    # front sets it and drops the clients' own: a client could otherwise pick a new id per request).
    trust_fairness_id: bool = False
    # x-gateway-inference-priority must lie in this range, else 400.
    priority_range: tuple[int, int] = (-1000, 1000)
    # Optional API key for the OpenAI routes and /v1/pick, as vLLM's --api-key: clients send
    # `Authorization: Bearer <key>`; a missing or wrong key is 401. None: no key. A list: any of
    # them, each key a client of its own for the per-client limits.
    api_key: str | list[str] | None = None
    # The admin routes (serve_app/admin/api.py: /admin/pods, `epp pods`) need `Authorization: Bearer
    # <admin_token>`; None (the default) turns them off (404). Not the api_key: clients that may
    # send completions may not change the pool.
    admin_token: str | None = Field(default=None, min_length=16)
    # Answer 404 for a model no pod lists in /v1/models (nor runs, per its metrics). Turn off when
    # pods load LoRA adapters on demand that they do not list before the first request.
    reject_unknown_models: bool = True
    # A connection failure or a 503 before the first byte is retried on another endpoint.
    max_retries: int = Field(default=2, ge=0)
    # The whole exchange with a model server (a non-streaming request's answer comes in one piece
    # at the end, so it is bounded by this alone).
    upstream_timeout_s: float = Field(default=600.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    # A streaming request's response headers must arrive within this, else the pod counts as
    # hung: the request goes to another endpoint (nothing has reached the client yet).
    first_byte_timeout_s: float = Field(default=30.0, gt=0)
    # A stream silent for this long between chunks is ended with an error event.
    stream_idle_timeout_s: float = Field(default=60.0, gt=0)
    # How long the gateway's HTTP server keeps an idle client connection open. It must outlast
    # every client's own pool (httpx and the OpenAI SDK: 5 s, aiohttp: 15 s): with uvicorn's 5 s
    # default a client could send on a connection the server was closing at that moment and see
    # it drop before any answer (aiohttp ServerDisconnectedError, httpx RemoteProtocolError).
    # 65 s, as load balancers do (AWS ALB 60 s, nginx 75 s).
    keep_alive_timeout_s: float = Field(default=65.0, gt=0)
    # With the flowControl gate: requests dispatched from the queue and not yet scheduled, at most
    # (a ledger detector sees a request only once it is scheduled, so this bounds what one dispatch
    # pass lets through unseen). None: one per endpoint. The profile actors tell their ledgers each
    # decision as they make it, so the requests of one pass do not herd onto one endpoint.
    flow_dispatch_window: int | None = Field(default=None, ge=1)
    # From this pool saturation on (the detectors' highest, 1.0 = saturated), only one dispatched
    # request may wait for its decision: close to the line a pass of unseen dispatches overfills
    # the pods (critical TTFT p90 1.6x end to end, docs/decisions/0003-dispatch-window.md). 1.0: never.
    flow_dispatch_narrow_at: float = Field(default=0.5, gt=0, le=1)
    # Queue depth / KV thresholds of the saturation detector used for admission (GIE defaults).
    saturation_queue_depth: int = Field(default=5, ge=0)
    saturation_kv_cache: float = Field(default=0.8, ge=0, le=1)
    metrics_staleness_s: float = Field(default=2.0, gt=0)
    # A request waits at most this for its profile actors' answer (a restart included); a frozen
    # or long-restarting actor then costs a 503 naming it, not a wait without end.
    profile_call_timeout_s: float = Field(default=10.0, gt=0)
    # A profile actor with a standby on another node (docs/DESIGN.md, "Profile standbys") gets
    # this long of that budget; a batch it has not answered by then goes to the standby (an actor
    # whose node died is RESTARTING for Ray, which then holds calls instead of failing them).
    profile_failover_after_s: float = Field(default=0.5, gt=0)
    # The decision trace (x-epp-trace, /v1/pick's "trace") names pods, addresses and scores: an
    # operator's tool, off by default. With `debug_token` set, a request gets it by sending
    # `x-epp-debug: <token>`; `debug_trace: true` gives it to any non-empty x-epp-debug (local
    # use and tests only).
    debug_header: str = "x-epp-debug"
    debug_token: str | None = None
    debug_trace: bool = False
    # POST /v1/pick (the decision without forwarding, for use behind another proxy). Off by default:
    # it answers 404 like any unknown route. When on, it needs the api_key like the OpenAI routes.
    pick_api: bool = False
    # On the shared port, POST /v1/completions, /v1/chat/completions and /v1/pick skip FastAPI's
    # routing and middleware (serve_app/gateway/hot_routes.py: about a third of a request's CPU in
    # the replica; FastAPI middleware then does not see them).
    # False: they take the FastAPI app like every other route.
    hot_routes: bool = True
    # The profiles run in this replica on its view of the pool, not in the profile actors
    # (serve_app/gateway/local_runner.py): no actor hop per request; the plugins' state (prefix
    # index, in-flight ledgers) is this replica's own, so it suits one replica, or replicas that
    # may each learn on their own; no standby, no shards, no KV-event plugins (refused). The
    # launcher then starts no profile actor (scheduler/config/placement.py `DecideIn`).
    decide_in_replica: bool = False
    # The replica's view of the pool takes at most one datastore version per this interval (as
    # the profile actors' snapshot_min_interval_s): with many pods the pool changes every few ms,
    # and every replica's watch call costs the datastore (docs/SCALING.md). 0: every version.
    snapshot_min_interval_s: float = Field(default=0.025, ge=0, le=1)
    # Profile shards (`profile_shards` at launch): a request goes to the shard picked by the hash of
    # its prompt's first `shard_key_tokens` tokens (x4 characters), so requests that can share a
    # cached prefix share a shard. Keep it at most the prefix index's block size (16 tokens by
    # default) for exact prefix affinity; more spreads a shared system prompt over the shards (each
    # learns it on its own pods). With `shard_session_header` set, a request carrying that header
    # is keyed by its value instead. docs/DESIGN.md, "Profile shards".
    shard_key_tokens: int = Field(default=16, ge=1, le=65536)
    shard_session_header: str | None = Field(default=None, min_length=1)
    # P/D hand-off. "orchestrated": the gateway runs the prefill step on the prefill pod, then sends
    # the request with the returned kv_transfer_params to the decode pod. "sidecar": the gateway
    # only sets x-prefiller-host-port and forwards to the decode pod (llm-d's routing sidecar).
    pd_mode: Literal["orchestrated", "sidecar"] = "orchestrated"
    # A prefill step that fails (connection error, 5xx) is retried this many times on the same
    # prefill pod, then the request is served decode-only ("decode-only", as llm-d's sidecar does) or failed ("fail").
    pd_prefill_retries: int = Field(default=0, ge=0)
    pd_prefill_failure: Literal["decode-only", "fail"] = "decode-only"
    # OpenTelemetry traces (the `tracing` extra; docs/OBSERVABILITY.md, "Traces"): the share of
    # requests traced when the client sends no sampled traceparent (one that does is always
    # followed). 0, the default: tracing off, opentelemetry never imported. Spans go by OTLP/HTTP
    # to `tracing_otlp_endpoint` (None: OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4318);
    # `tracing_exporter: none` only propagates: spans are made and the traceparent sent on to the
    # model servers, nothing is exported.
    tracing_sample_ratio: float = Field(default=0.0, ge=0, le=1)
    tracing_service_name: str = Field(default="ray-epp-gateway", min_length=1)
    tracing_otlp_endpoint: str | None = None
    tracing_exporter: Literal["otlp", "none"] = "otlp"
    # The decision record (docs/OBSERVABILITY.md, "Why it went there"): the share of requests
    # (by the hash of their request id) whose decision is kept, each filter's survivors and each
    # scorer's scores per endpoint, for GET /admin/decisions and `epp explain` (the admin_token's
    # routes). 0, the default: none. `decision_record_size`: the requests kept over every replica
    # (the newest; a record is a few KB with a handful of endpoints, tens of KB with a hundred).
    decision_record_ratio: float = Field(default=0.0, ge=0, le=1)
    decision_record_size: int = Field(default=1000, ge=1, le=100_000)

    @property
    def decide_in(self) -> DecideIn:
        """Who runs the profiles, as the config's placement and the launcher take it."""
        return DecideIn.REPLICA if self.decide_in_replica else DecideIn.PROFILE_ACTORS


def load_settings_file(path: str | Path) -> GatewaySettings:
    """The settings in a YAML file; any problem is a ValueError naming the file."""
    try:
        text = Path(path).read_text()
        if nests_deeper_than(text):
            raise ValueError(f"settings file {str(path)!r}: the YAML nests deeper than {MAX_FILE_NESTING} levels")
        data = yaml.safe_load(text) or {}
        return GatewaySettings.model_validate(data)
    except OSError as err:
        raise ValueError(f"can not read settings file {str(path)!r}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"settings file {str(path)!r} is not UTF-8 text: {err}") from None
    except (yaml.YAMLError, ValidationError) as err:
        raise ValueError(f"invalid settings file {str(path)!r}: {err}") from None
    except RecursionError:  # PyYAML's parser recurses once per nesting level
        raise ValueError(f"settings file {str(path)!r}: the YAML nests deeper than the parser can follow") from None
