"""An online latency model per endpoint: recursive least squares (RLS) on a few features, learned
from what the gateway observes (a request's time to first token, its time per output token), never
from the model server's own cost model. What `predicted-latency-producer` keeps (a helper).

Why RLS on a handful of features rather than llm-d's trained sidecars (XGBoost / Bayesian ridge
in a training server): a server's TTFT is close to linear in the prompt work ahead of the request
(queued and in-flight uncached tokens, FCFS under a per-step token budget) plus the request's own
uncached tokens, and its TPOT in the running batch; RLS fits exactly that, one O(d²) update per
response (d = 7: ~20 µs in Python), one dot product per endpoint per decision, no library, no
training round trip, and a forgetting factor that follows a server that slows down.

Cold start: every observation also updates a pool-wide model (the shared prior); an endpoint
predicts from its own model once it has `min_samples` observations, else from the pool's; with
fewer than `min_samples` in the pool there is no prediction, and the plugins that read it step
aside (today's scorers decide)."""

from __future__ import annotations

from dataclasses import dataclass, field

TTFT_FEATURES = ("bias", "waiting", "running", "kv_use", "uncached_ktok", "inflight_prefill_ktok", "inflight_new")
TPOT_FEATURES = ("bias", "running", "kv_use", "inflight_requests")


@dataclass(slots=True)
class RLS:
    """Recursive least squares with exponential forgetting: theta minimises
    sum_i lam^(n-i) (y_i - theta . x_i)^2 + prior. P starts at `delta` I (a weak prior on theta)."""

    dim: int
    forgetting: float = 0.995
    delta: float = 1e3
    theta: list[float] = field(default_factory=list)
    p: list[list[float]] = field(default_factory=list)
    samples: int = 0

    def __post_init__(self) -> None:
        if not self.theta:
            self.theta = [0.0] * self.dim
        if not self.p:
            self.p = [[self.delta if i == j else 0.0 for j in range(self.dim)] for i in range(self.dim)]

    def predict(self, x: list[float]) -> float:
        return sum(t * v for t, v in zip(self.theta, x, strict=True))

    def update(self, x: list[float], y: float) -> None:
        p, lam, d = self.p, self.forgetting, self.dim
        px = [sum(row[j] * x[j] for j in range(d)) for row in p]
        denom = lam + sum(x[i] * px[i] for i in range(d))
        if denom <= 1e-12:  # a degenerate direction; skip rather than blow P up
            return
        gain = [v / denom for v in px]
        error = y - self.predict(x)
        self.theta = [t + g * error for t, g in zip(self.theta, gain, strict=True)]
        # P = (P - k (P x)^T) / lam; P stays symmetric, so (P x)^T is x^T P.
        self.p = [[(p[i][j] - gain[i] * px[j]) / lam for j in range(d)] for i in range(d)]
        self.samples += 1


class LatencyModel:
    """One quantity (TTFT or TPOT, in milliseconds) per endpoint plus the pool's shared prior."""

    __slots__ = ("dim", "endpoints", "forgetting", "min_samples", "pool", "ready")

    def __init__(self, dim: int, min_samples: int = 16, forgetting: float = 0.995) -> None:
        self.dim = dim
        self.min_samples = min_samples
        self.forgetting = forgetting
        self.pool = RLS(dim, forgetting)
        self.endpoints: dict[str, RLS] = {}
        self.ready: dict[str, RLS] = {}  # the endpoints with min_samples of their own

    @property
    def warm(self) -> bool:
        return self.pool.samples >= self.min_samples

    def observe(self, endpoint: str, x: list[float], y: float) -> None:
        own = self.endpoints.get(endpoint)
        if own is None:
            # A new endpoint starts from the pool's fit (the shared prior) held loosely (a fresh
            # P), so its own observations take over within a few samples.
            own = self.endpoints[endpoint] = RLS(self.dim, self.forgetting, theta=list(self.pool.theta))
        own.update(x, y)
        if own.samples >= self.min_samples:
            self.ready[endpoint] = own
        self.pool.update(x, y)

    def weights(self) -> tuple[dict[str, RLS], RLS] | None:
        """For callers that inline the dot product: the endpoints whose own model is warm, and the
        pool's model for the others; None while cold."""
        return (self.ready, self.pool) if self.warm else None

    def predict(self, endpoint: str, x: list[float]) -> float | None:
        """Milliseconds, at least 0; None while the pool has too few observations."""
        if not self.warm:
            return None
        return max(0.0, self.ready.get(endpoint, self.pool).predict(x))

    def forget(self, endpoint: str) -> None:
        self.endpoints.pop(endpoint, None)
        self.ready.pop(endpoint, None)
