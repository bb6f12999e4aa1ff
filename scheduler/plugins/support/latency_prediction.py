"""What `predicted-latency-producer` hands its consumers (`latency-scorer`, `slo-headroom-tier-filter`,
`latency-slo-admitter`, `prefix-cache-affinity-filter` with `ttftSource: latencyPredictor`): this
request's predicted TTFT / TPOT per endpoint name, under the producer's PREDICTED_LATENCY key.

The key is absent while the producer's TTFT model is cold: a consumer then steps aside (neutral
scores, every endpoint passes), as it does for a request that opts out
(`x-prediction-based-scheduling: false`), which each consumer reads from the request itself."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from scheduler.data_keys import DataKey, consumed_key
from scheduler.interfaces import Parameters, PluginHandle


@dataclass(slots=True)
class Prediction:
    ttft_ms: float
    tpot_ms: float | None  # None until the TPOT model is warm


# Per endpoint name of the profile's pool, under the producer's own name (llm-d's default: its type).
PREDICTED_LATENCY: DataKey[dict[str, Prediction]] = DataKey("predicted-latency", "predicted-latency-producer")


class PredictorParameters(Parameters):
    """A consumer's choice of producer (llm-d's `predictorName`; empty: `predicted-latency-producer`)."""

    predictor_name: str = Field(default="", alias="predictorName")


def predicted_latency_key(
    handle: PluginHandle, producer_name: str, field: str = "predictorName"
) -> DataKey[dict[str, Prediction]]:
    """The key a consumer reads: that of the producer `producer_name` names, else the default's."""
    return consumed_key(handle, PREDICTED_LATENCY, producer_name, field, "latency predictions")
