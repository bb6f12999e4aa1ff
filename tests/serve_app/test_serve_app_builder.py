"""The gateway through Serve's own entry point: an application builder with args, as `serve run`
and Serve config files use it."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest

from tests.conftest import GATEWAY_TEST_PORT

pytestmark = pytest.mark.ray


def test_build_app_serves_behind_serve_run(ray_session, tmp_path):
    from ray import serve

    from ray_epp.simulator import start_sim_pods_in_thread
    from serve_app.app import build_app
    from serve_app.cli.launch import wait_for_gateway

    with start_sim_pods_in_thread(2, time_scale=1.0) as sim:
        pods = tmp_path / "pods.json"
        pods.write_text(json.dumps(sim.pods_json()))
        serve.start(http_options={"host": "127.0.0.1", "port": GATEWAY_TEST_PORT + 88})
        try:
            app = build_app({"pods": str(pods), "detached": "false", "port": str(GATEWAY_TEST_PORT)})
            serve.run(app, name="built", route_prefix="/")
            url = wait_for_gateway("127.0.0.1", GATEWAY_TEST_PORT, "built", 1, timeout_s=120)
            resp = httpx.post(
                f"{url}/v1/completions",
                json={"model": sim.pods[0].config.model, "prompt": "hi", "max_tokens": 2},
                timeout=60,
            )
            assert resp.status_code == 200
            assert resp.headers["x-gateway-destination-endpoint"] in {f"127.0.0.1:{p.port}" for p in sim.pods}
        finally:
            serve.delete("built")  # Serve stays up for the next module (it is the session's)
            import ray

            from actors.launcher import profile_actor_name

            for name in ("epp-datastore", profile_actor_name("epp-datastore", "default")):
                with contextlib.suppress(ValueError):
                    ray.kill(ray.get_actor(name), no_restart=True)


def test_build_app_without_pods_is_a_clear_error():
    from serve_app.app import build_app

    with pytest.raises(ValueError, match="needs pods="):
        build_app({})
