"""A new gateway replica's first request waits for its first snapshot of the pool instead of
answering 503 ("no ready model server") from an empty view: no Ray, a slow fake datastore."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.snapshot_delta import DeltaLog
from scheduler import Endpoint, LLMRequest
from serve_app.gateway.core import GatewayCore

CONFIG = (Path(__file__).resolve().parents[2] / "ray_epp" / "configs" / "default.yaml").read_text()


class _Remote:
    def __init__(self, fn) -> None:
        self._fn = fn

    def remote(self, *args):
        return self._fn(*args)


class SlowDatastore:
    """Answers the first watch after `delay` seconds with one pod, then holds the long poll."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.watch_delta = _Remote(self._watch_delta)
        self.models = _Remote(self._models)
        self._log = DeltaLog(1)
        self._pool = [Endpoint(name="pod-a", address="127.0.0.1", port=1)]

    async def _watch_delta(self, version: int, timeout: float):
        if version == 0:
            await asyncio.sleep(self.delay)
        else:
            await asyncio.sleep(timeout)
        return self._log.packed(version, 1, self._pool)

    async def _models(self):
        return ["m"]


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_the_first_request_waits_for_the_first_snapshot(delay):
    async def main():
        core = GatewayCore(CONFIG, {}, SlowDatastore(delay), {}, None)
        assert not core.view.has_first
        await core.ensure_ready()
        assert core.view.has_first and [ep.name for ep in core.view.endpoints] == ["pod-a"]
        await core.admit(LLMRequest(request_id="r", target_model="m", body={"model": "m", "prompt": "x"}))  # no 503
        await core.view.stop()

    asyncio.run(main())

