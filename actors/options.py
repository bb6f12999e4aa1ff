"""The edge models of the actor layer: a pod to scrape (`PodSpec`) and the knobs of the actors
(`ActorOptions`). Pydantic, validated where they enter; the actors get them as plain dicts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_DATASTORE_NAME = "epp-datastore"
# Where a pod publishes its KV events (its pods-file `kvEvents`), as labels of its endpoint.
KV_EVENTS_LABEL = "kv-events.ray-epp.io/endpoint"
KV_REPLAY_LABEL = "kv-events.ray-epp.io/replay"


class PodSpec(BaseModel):
    """A model server: where to reach it and its labels (engine type, P/D role, ...). `node` (a Ray
    node id) or `node_labels` (Ray node labels it must carry, e.g. from `ray start --labels`) say
    which Ray node it runs on, so that its metrics actor is placed there; without them (or when no
    alive node matches) a pod is on the node whose IP is its address (actors/metrics_groups.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    address: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    labels: dict[str, str] = Field(default_factory=dict)
    node: str | None = Field(None, pattern=r"^[0-9a-f]{56}$")
    node_labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _kv_events(cls, data: Any) -> Any:
        """`kvEvents: {endpoint: tcp://host:port, replay: tcp://host:port}` (where the pod publishes
        vLLM's KV events, e.g. `epp sim`'s pods) becomes two labels the profile actors read
        (actors/kv_event_feeds.py), so it travels with the pod's endpoint."""
        if not isinstance(data, dict) or not ({"kvEvents", "kv_events"} & data.keys()):
            return data
        data = dict(data)
        spec = data.pop("kvEvents", None) or data.pop("kv_events", None)
        if spec is None:
            return data
        if not isinstance(spec, dict) or not isinstance(spec.get("endpoint"), str) or not spec["endpoint"]:
            raise ValueError("kvEvents must be {endpoint: tcp://host:port, replay?: tcp://host:port}")
        unknown = set(spec) - {"endpoint", "replay"}
        if unknown:
            raise ValueError(f"kvEvents has unknown fields {sorted(unknown)} (endpoint, replay)")
        labels = dict(data.get("labels") or {})
        labels[KV_EVENTS_LABEL] = spec["endpoint"]
        if spec.get("replay"):
            labels[KV_REPLAY_LABEL] = str(spec["replay"])
        data["labels"] = labels
        return data

    @field_validator("name", "address")
    @classmethod
    def _no_blanks(cls, v: str) -> str:
        if not v.strip() or v != v.strip():
            raise ValueError("must be non-empty and have no surrounding spaces")
        return v

    @property
    def base_url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address and not self.address.startswith("[") else self.address
        return f"http://{host}:{self.port}"


class ActorOptions(BaseModel):
    """How the EPP actors run. Resource defaults suit a 2-core machine: every actor asks for no CPU
    (they are light and mostly waiting), so they never block Serve replicas from being placed."""

    model_config = ConfigDict(extra="forbid")

    datastore_name: str = Field(DEFAULT_DATASTORE_NAME, min_length=1)
    # Detached actors outlive the driver that created them (a long-running deployment); when False
    # the datastore and profile actors die with it. Metrics actors are always detached (see datastore).
    detached: bool = False
    datastore_num_cpus: float = Field(0.0, ge=0)
    metrics_num_cpus: float = Field(0.0, ge=0)
    profile_num_cpus: float = Field(0.0, ge=0)
    # Scraping: GIE's refreshMetricsInterval is 50 ms.
    refresh_interval_s: float = Field(0.05, gt=0)
    scrape_timeout_s: float = Field(1.0, gt=0)
    metrics_path: str = "/metrics"
    # "fast": the keep-alive asyncio-streams client (actors/http_get.py, half aiohttp's CPU per
    # scrape); "aiohttp" for servers it does not understand (TLS is not supported by either here).
    http_client: Literal["fast", "aiohttp"] = "fast"
    models_path: str = "/v1/models"
    models_refresh_s: float = Field(10.0, gt=0)
    # A pod's metrics are reported on change, and at least this often: so the datastore knows it is
    # alive, and so the update_time (scrape time) in snapshots is at most about this old (readers
    # get a newer one only with a new snapshot). GIE's utilization detector calls metrics older than
    # 200 ms stale: 0.1 keeps them fresh for it, at ~10 report calls and snapshot versions a second
    # per metrics actor even when nothing changes. The heartbeats of a metrics actor's pods share
    # one report call.
    heartbeat_s: float = Field(1.0, gt=0)
    # Changed metrics are reported at most this often (0: every change).
    min_report_interval_s: float = Field(0.0, ge=0)
    # "node": one metrics actor scrapes the pods of one Ray node (pods on no Ray node share actors
    # too), at most max_pods_per_metrics_actor each; more pods on a node get more actors. "pod": an
    # actor per pod (GIE's and the first design's shape; a Ray call per report and a process per pod,
    # DESIGN.md "One metrics actor per node"), on the pod's node. Either way an actor follows its pods.
    metrics_actor_scope: Literal["node", "pod"] = "node"
    max_pods_per_metrics_actor: int = Field(16, ge=1)
    # A metrics actor sends what its scrapers have to report in one Ray call per scrape round (a
    # call costs ~1.5 ms of CPU in the metrics actor and ~2.4 ms in the datastore, whatever it
    # carries): the call goes when every scrape of the round is through, but a report waits at most
    # this long for slow ones (0: at once; reports that come while a call is in flight still share
    # the next one).
    report_batch_max_wait_s: float = Field(0.02, ge=0)

    # Health: GIE's metricsStalenessThreshold is 2 s.
    staleness_threshold_s: float = Field(2.0, gt=0)
    unhealthy_after_failures: int = Field(5, ge=1)
    check_interval_s: float = Field(0.1, gt=0)
    # Profile actors take at most one snapshot per this interval (bounds watch traffic when many
    # pods change every scrape); 0 takes every version.
    snapshot_min_interval_s: float = Field(0.025, ge=0)
    watch_timeout_s: float = Field(5.0, gt=0)
    # One follower of the datastore per Ray node serves that node's readers (profile actors, gateway
    # replicas) over the same-node channel, so the datastore delivers each version once per node,
    # not once per reader (actors/snapshot_relay.py; docs/SCALING.md). Worth it with many readers.
    snapshot_relays: bool = False
    # How often a profile actor hands its pods' KV-event batches to its plugins (actors/kv_event_feeds.py).
    kv_events_drain_s: float = Field(0.02, gt=0)
    profile_max_task_retries: int = Field(0, ge=-1)
    # The datastore and the profile actors prefer Ray nodes with these labels (soft: when none is
    # alive they run, and are restarted, elsewhere), e.g. CPU nodes next to the gateway replicas;
    # {}: where Ray likes.
    datastore_node_labels: dict[str, str] = Field(default_factory=dict)
    profile_node_labels: dict[str, str] = Field(default_factory=dict)
    # Each scheduling profile runs as this many actors (shards); a gateway sends a request to one
    # shard by a key that keeps prefix affinity (serve_app/gateway/shard_key.py). Each shard has its own
    # prefix index and in-flight ledgers (docs/DESIGN.md, "Profile shards"). 1: one actor per profile.
    profile_shards: int = Field(1, ge=1, le=64)
    # A standby per profile actor (shard) on another Ray node, fed the same events, that a gateway
    # turns to when the actor or its node dies (docs/DESIGN.md, "Profile standbys"). "auto": when
    # at least two alive nodes can hold one; "on": always tried; "off": never.
    profile_standby: Literal["auto", "on", "off"] = "auto"
    # Modules to import in every profile actor before its config is built: custom plugins.
    plugin_modules: list[str] = Field(default_factory=list)
    # Profile actors also serve run_batch on 127.0.0.1 for gateway replicas on their node: a Ray
    # call from a Serve replica costs several ms here, a local socket a fraction of one.
    direct_channel: bool = True
    # Profile actors push their plugin timings to the metrics hub (for /metrics).
    push_plugin_metrics: bool = True
    # Profile actors tell their in-flight ledgers each decision as they make it, before the
    # gateway's PreRequest (actors/tentative_decisions.py). Off: the ledgers learn PreRequests only.
    tentative_decisions: bool = True
    # Draining (actors/pod_state.py): a removed pod leaves once it reports no running or waiting
    # request at least drain_settle_s after the drain began, or at drain_timeout_s (the default is
    # the gateway's upstream_timeout_s: the longest a request through the gateway can last).
    drain_settle_s: float = Field(0.5, ge=0)
    drain_timeout_s: float = Field(600.0, gt=0)
    # GIE's core-metrics-extractor parameters (engineLabelKey, defaultEngine, engineConfigs).
    metrics_extractor: dict[str, Any] | None = None

    @field_validator("metrics_extractor")
    @classmethod
    def _valid_extractor(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            from scheduler.engine_metrics import EngineRegistry

            EngineRegistry.from_params(v)  # raises ValueError naming the bad entry
        return v


def with_data_layer(options: ActorOptions, data_layer: dict[str, Any]) -> ActorOptions:
    """The options with the config's data-layer settings (`scheduler.config.data_layer_actor_options`:
    the metrics source's path and interval, the extractor's engine configs) where the options leave
    them at their defaults; a field both set to different values is a ValueError naming it."""
    update: dict[str, Any] = {}
    for field, value in data_layer.items():
        if field in options.model_fields_set and getattr(options, field) != value:
            raise ValueError(
                f"actor option {field}={getattr(options, field)!r} contradicts the config's data layer ({value!r})"
            )
        update[field] = value
    return ActorOptions.model_validate({**options.model_dump(exclude_unset=True), **update}) if update else options


def as_options(options: ActorOptions | dict[str, Any] | None) -> ActorOptions:
    if options is None:
        return ActorOptions()
    if isinstance(options, ActorOptions):
        return options
    return ActorOptions.model_validate(options)


def as_pod(spec: PodSpec | dict[str, Any]) -> PodSpec:
    return spec if isinstance(spec, PodSpec) else PodSpec.model_validate(spec)
