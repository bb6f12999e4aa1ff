"""deploy/rayservice.yaml is a KubeRay RayService whose embedded Serve config is one Serve accepts
(ray.serve.schema.ServeDeploySchema, what `serve deploy` and KubeRay's PUT check) and whose
application builds: `serve_app.app:build_app` with the manifest's args (the ConfigMap's pods file
in a temporary folder) returns the gateway application, in the test Ray.
The app is built, not run: no port is bound and the pods (cluster DNS names) are never reached."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml
from ray.serve import Application
from ray.serve.schema import ServeDeploySchema

from actors.launcher import parse_pods
from serve_app.cli.launch import GCS_TASK_EVENTS_KEPT, TASK_EVENTS_REPORT_INTERVAL_MS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "rayservice.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module")
def serve_config(manifests) -> ServeDeploySchema:
    return ServeDeploySchema.model_validate(yaml.safe_load(manifests["RayService"]["spec"]["serveConfigV2"]))


def test_is_a_rayservice(manifests):
    svc = manifests["RayService"]
    assert svc["apiVersion"] == "ray.io/v1"
    assert svc["metadata"]["name"]
    cluster = svc["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    (workers,) = cluster["workerGroupSpecs"]
    worker = workers["template"]["spec"]["containers"][0]
    assert workers["replicas"] >= 2 and workers["minReplicas"] <= workers["replicas"] <= workers["maxReplicas"]
    for container in (head, worker):
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0", "each replica serves the gateway port itself"
        # the GCS bounded as under `epp up`: task events off, and capped where an operator turns them on
        assert env["RAY_task_events_report_interval_ms"] == TASK_EVENTS_REPORT_INTERVAL_MS
        assert env["RAY_task_events_max_num_task_in_gcs"] == str(GCS_TASK_EVENTS_KEPT)
        assert {"serve", "gateway"} <= {p["name"] for p in container["ports"]}
        assert container["volumeMounts"][0]["name"] == "epp-pods"
    assert cluster["rayVersion"].split(".")[:2] == __import__("ray").__version__.split(".")[:2]


def test_embedded_serve_config_is_valid(serve_config, manifests):
    (app,) = serve_config.applications
    assert app.import_path == "serve_app.app:build_app"
    assert app.args["port"] != serve_config.http_options.port, "the gateway port is not Serve's proxy port"
    mount = manifests["RayService"]["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    mount_path = mount["containers"][0]["volumeMounts"][0]["mountPath"]
    assert app.args["pods"] == f"{mount_path}/pods.yaml"
    assert parse_pods(yaml.safe_load(manifests["ConfigMap"]["data"]["pods.yaml"]))


def test_serve_rejects_a_broken_config(manifests):
    """The schema check can fail: an application without its import path."""
    broken = yaml.safe_load(manifests["RayService"]["spec"]["serveConfigV2"])
    del broken["applications"][0]["import_path"]
    with pytest.raises(ValueError, match="import_path"):
        ServeDeploySchema.model_validate(broken)


def test_its_application_builds(ray_session, serve_config, manifests, tmp_path):
    from actors.launcher import profile_actor_name
    from actors.options import DEFAULT_DATASTORE_NAME
    from scheduler import load_config_file
    from serve_app.app import build_app

    (app,) = serve_config.applications
    pods_file = tmp_path / "pods.yaml"
    pods_file.write_text(manifests["ConfigMap"]["data"]["pods.yaml"])
    args = dict(app.args)
    args["pods"] = str(pods_file)
    args["detached"] = "false"  # the test's actors die with the test session if cleanup below fails
    try:
        built = build_app(args)
        assert isinstance(built, Application)
        deployment = built._bound_deployment
        assert deployment.name == "Gateway"
        assert deployment.num_replicas == args["replicas"] >= 2  # one replica's death is no outage
        assert deployment._replica_config.max_replicas_per_node == 1  # nor one pod's
    finally:
        ray = ray_session
        for profile in load_config_file(args["config"]).scheduling_profiles:
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(profile_actor_name(DEFAULT_DATASTORE_NAME, profile.name)), no_restart=True)
        with contextlib.suppress(ValueError):
            datastore = ray.get_actor(DEFAULT_DATASTORE_NAME)
            ray.get(datastore.shutdown.remote(), timeout=30)
            ray.kill(datastore, no_restart=True)
