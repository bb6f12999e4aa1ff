"""The pod sources a datastore can be given, as specs (plain dicts cross the Ray call), and the
source each spec describes. Apart from actors/pod_source.py (the interface) so that the
interface does not import its implementations."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from actors.pod_source import PodSource
from actors.pod_source_file import WatchedPodsFile


class FileSourceSpec(BaseModel):
    """A pods file watched for changes (polled: a stat every `interval_s`, a read when it changed)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["file"] = "file"
    path: str = Field(min_length=1)
    interval_s: float = Field(1.0, gt=0)


PodSourceSpec = FileSourceSpec  # a union once there is a second kind (e.g. kubernetes)


def build_pod_source(spec: PodSourceSpec | dict[str, Any]) -> PodSource:
    """The source a spec describes (the datastore gets specs as plain dicts)."""
    parsed = spec if isinstance(spec, BaseModel) else FileSourceSpec.model_validate(spec)
    return WatchedPodsFile(parsed.path, parsed.interval_s)
