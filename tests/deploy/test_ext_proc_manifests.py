"""deploy/envoy.yaml is an Envoy bootstrap Envoy's own schema accepts (parsed into xds-protos'
Bootstrap message, every typed_config resolved), wired as GIE's protocol needs; and
deploy/inferencepool.yaml's InferencePool reaches the ext_proc port deploy/rayservice.yaml's
replicas serve."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

# The typed_config messages the bootstrap names must be known to protobuf's registry to parse.
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from google.protobuf import json_format

from serve_app.extproc.protocol import DESTINATION_KEY
from serve_app.extproc.service import EXT_PROC_SERVICE

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bootstrap() -> bootstrap_pb2.Bootstrap:
    return json_format.ParseDict(
        yaml.safe_load((ROOT / "deploy" / "envoy.yaml").read_text()), bootstrap_pb2.Bootstrap()
    )


def test_envoy_bootstrap_wires_ext_proc_as_the_protocol_asks(bootstrap):
    (listener,) = bootstrap.static_resources.listeners
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    names = [f.name for f in hcm.http_filters]
    assert names == ["envoy.filters.http.ext_proc", "envoy.filters.http.router"]
    ext_proc = ext_proc_pb2.ExternalProcessor()
    hcm.http_filters[0].typed_config.Unpack(ext_proc)
    mode = ext_proc.processing_mode
    streamed = ext_proc.processing_mode.FULL_DUPLEX_STREAMED
    assert mode.request_body_mode == streamed and mode.response_body_mode == streamed
    assert not ext_proc.failure_mode_allow
    assert "envoy.lb.subset_hint" in ext_proc.metadata_options.forwarding_namespaces.untyped
    clusters = {c.name: c for c in bootstrap.static_resources.clusters}
    assert ext_proc.grpc_service.envoy_grpc.cluster_name in clusters
    original = clusters[hcm.route_config.virtual_hosts[0].routes[0].route.cluster]
    assert original.type == original.ORIGINAL_DST
    assert original.original_dst_lb_config.use_http_header
    assert original.original_dst_lb_config.http_header_name == DESTINATION_KEY
    picker = clusters[ext_proc.grpc_service.envoy_grpc.cluster_name]
    assert picker.health_checks[0].grpc_health_check.service_name == EXT_PROC_SERVICE
    addresses = [
        e.endpoint.address.socket_address.address for e in picker.load_assignment.endpoints[0].lb_endpoints
    ] + [listener.address.socket_address.address]
    assert all(a.startswith("127.") for a in addresses)


def test_inference_pool_points_at_the_replicas_ext_proc_port():
    docs = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "deploy" / "inferencepool.yaml").read_text()) if d}
    pool, service = docs["InferencePool"], docs["Service"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["kind"] == "Service" and ref["name"] == service["metadata"]["name"]
    (port,) = service["spec"]["ports"]
    assert ref["port"]["number"] == port["port"] and port["appProtocol"] == "http2"
    rayservice = next(
        d
        for d in yaml.safe_load_all((ROOT / "deploy" / "rayservice.yaml").read_text())
        if d and d["kind"] == "RayService"
    )
    assert service["spec"]["selector"]["ray.io/originated-from-cr-name"] == rayservice["metadata"]["name"]
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    assert app["args"]["ext_proc_port"] == port["port"]
    cluster = rayservice["spec"]["rayClusterConfig"]
    for spec in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        ports = {p["name"]: p["containerPort"] for p in spec["template"]["spec"]["containers"][0]["ports"]}
        assert ports[port["targetPort"]] == app["args"]["ext_proc_port"]
    route = docs["HTTPRoute"]
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == pool["metadata"]["name"]
