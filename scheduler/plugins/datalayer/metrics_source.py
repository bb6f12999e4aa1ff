"""`metrics-data-source` (llm-d's pkg/epp/framework/plugins/datalayer/source/metrics): scrape each
pod's Prometheus metrics over HTTP. Ray EPP's metrics actors are this source: they GET
`http://<address>:<port><path>` every `interval` (`ActorOptions.metrics_path`,
`refresh_interval_s`, which this plugin's parameters set through `data_layer_actor_options`).

What they can not do is refused at load time: `https` and the TLS files (the scrape clients speak
plain HTTP), and `port` (a per-source port override: a pod is scraped on its own port)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from scheduler.duration import parse_duration
from scheduler.interfaces import Parameters, Plugin
from scheduler.registry import register


class MetricsSourceParameters(Parameters):
    scheme: str = "http"
    path: str = "/metrics"
    port: int | None = None
    insecure_skip_verify: bool = Field(default=True, alias="insecureSkipVerify")  # TLS only: moot over http
    ca_cert_path: str = Field(default="", alias="caCertPath")
    client_cert_path: str = Field(default="", alias="clientCertPath")
    client_key_path: str = Field(default="", alias="clientKeyPath")
    interval: str = ""

    @field_validator("scheme")
    @classmethod
    def _http(cls, value: str) -> str:
        if value != "http":
            raise ValueError(f"scheme {value!r}: Ray EPP's metrics actors scrape over plain http only (no TLS)")
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"path {value!r} must start with '/'")
        return value

    @field_validator("port")
    @classmethod
    def _no_port(cls, value: int | None) -> None:
        if value is not None:
            raise ValueError("a port override is not implemented: each pod is scraped on its own port")
        return None

    @field_validator("ca_cert_path", "client_cert_path", "client_key_path")
    @classmethod
    def _no_tls(cls, value: str) -> str:
        if value:
            raise ValueError("TLS files can not be used: the metrics actors scrape over plain http")
        return value

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        if value and parse_duration(value) <= 0:
            raise ValueError(f"interval must be a positive duration, got {value!r}")
        return value


@register
class MetricsDataSource(Plugin):
    type_name = "metrics-data-source"
    Parameters = MetricsSourceParameters

    @staticmethod
    def actor_options(p: MetricsSourceParameters) -> dict[str, Any]:
        """The ActorOptions fields a source with these parameters sets."""
        out: dict[str, Any] = {"metrics_path": p.path}
        if p.interval:
            out["refresh_interval_s"] = parse_duration(p.interval)
        return out
