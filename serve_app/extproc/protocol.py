"""GIE's Endpoint Picker Protocol on Envoy's ext_proc messages: the names the protocol fixes and
the few message shapes it needs, built from `xds-protos`' classes (docs/EXT_PROC.md).

* in: the request's headers (`raw_value`, or `value` from older proxies), the subset hint in
  `metadata_context.filter_metadata["envoy.lb.subset_hint"]`, and the endpoint that served in
  `filter_metadata["envoy.lb"]["x-gateway-destination-endpoint-served"]`;
* out: the pick as the `x-gateway-destination-endpoint` header and as `envoy.lb` dynamic metadata
  (one string for both, so they never differ), streamed body chunks under Envoy's 64 KiB per
  message, and ImmediateResponses with an OpenAI-shaped JSON body."""

from __future__ import annotations

import json
from collections.abc import Iterable

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from starlette.responses import Response

from serve_app.gateway.errors import GatewayError

DESTINATION_KEY = "x-gateway-destination-endpoint"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"
# Some Envoy builds cap a streamed body message at 64 KiB: GIE sends at most this much per message.
BODY_CHUNK_BYTES = 62_000


def header_map(headers: pb.HttpHeaders) -> tuple[dict[str, str], int]:
    """The headers by lower-case name (the last of repeated ones; HTTP/2's pseudo-headers such as
    `:path` and `:status` included) and the size in bytes of the others, names and values, as the
    HTTP door counts a request's headers."""
    out: dict[str, str] = {}
    size = 0
    for h in headers.headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        key = h.key.lower()
        out[key] = value
        if not key.startswith(":"):
            size += len(key) + len(value)
    return out, size


def subset_hint(request: pb.ProcessingRequest) -> list[str] | None:
    """The endpoints (`ip:port`) the data plane allows, or None when it sets no subset (the whole
    pool). An empty list is an answer too: nothing is allowed."""
    ns = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if ns is None or SUBSET_KEY not in ns.fields:
        return None
    value = ns.fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [v.string_value for v in value.list_value.values if v.WhichOneof("kind") == "string_value"]
    if kind == "string_value":  # a comma-separated string, as some data planes write it
        return [part.strip() for part in value.string_value.split(",") if part.strip()]
    return []


def served_endpoint(request: pb.ProcessingRequest) -> str | None:
    """Which endpoint (`ip:port`) served the request, when the data plane says so."""
    ns = request.metadata_context.filter_metadata.get(LB_NAMESPACE)
    if ns is None or SERVED_KEY not in ns.fields:
        return None
    value = ns.fields[SERVED_KEY].string_value.strip()
    return value.split(",")[0].strip() or None


def _set(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()))


def header_mutation(set_headers: dict[str, str], remove: Iterable[str] = ()) -> pb.HeaderMutation:
    return pb.HeaderMutation(set_headers=[_set(k, v) for k, v in set_headers.items()], remove_headers=list(remove))


def destination_metadata(destination: str) -> struct_pb2.Struct:
    """`{"envoy.lb": {"x-gateway-destination-endpoint": destination}}`."""
    meta = struct_pb2.Struct()
    meta.fields[LB_NAMESPACE].struct_value.fields[DESTINATION_KEY].string_value = destination
    return meta


def request_headers_response(mutation: pb.HeaderMutation, destination: str | None) -> pb.ProcessingResponse:
    out = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation))
    )
    if destination is not None:
        out.dynamic_metadata.CopyFrom(destination_metadata(destination))
    return out


def response_headers_response(mutation: pb.HeaderMutation) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation))
    )


def _body(data: bytes, end_of_stream: bool) -> pb.CommonResponse:
    streamed = pb.StreamedBodyResponse(body=data, end_of_stream=end_of_stream)
    return pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=streamed))


def body_chunks(data: bytes, end_of_stream: bool) -> list[pb.CommonResponse]:
    """`data` as streamed body messages of at most BODY_CHUNK_BYTES, the last one carrying
    `end_of_stream` (one empty message for an empty body)."""
    if not data:
        return [_body(b"", end_of_stream)]
    parts = [data[i : i + BODY_CHUNK_BYTES] for i in range(0, len(data), BODY_CHUNK_BYTES)]
    return [_body(part, end_of_stream and i == len(parts) - 1) for i, part in enumerate(parts)]


def request_body_responses(data: bytes, end_of_stream: bool) -> list[pb.ProcessingResponse]:
    return [pb.ProcessingResponse(request_body=pb.BodyResponse(response=c)) for c in body_chunks(data, end_of_stream)]


def response_body_responses(data: bytes, end_of_stream: bool) -> list[pb.ProcessingResponse]:
    return [pb.ProcessingResponse(response_body=pb.BodyResponse(response=c)) for c in body_chunks(data, end_of_stream)]


def trailers_response(request_side: bool) -> pb.ProcessingResponse:
    if request_side:
        return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def immediate(status: int, body: bytes, headers: dict[str, str] | None = None) -> pb.ProcessingResponse:
    """Envoy answers the client itself with this status, headers and body; the request goes nowhere."""
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=header_mutation({"content-type": "application/json", **(headers or {})}),
            body=body,
        )
    )


def immediate_error(err: GatewayError) -> pb.ProcessingResponse:
    """A GatewayError as the HTTP door would answer it: its status, headers and OpenAI-shaped body."""
    return immediate(err.status, json.dumps(err.body(), separators=(",", ":")).encode(), err.headers)


def immediate_response(response: Response) -> pb.ProcessingResponse:
    """An error a route shapes as its API does (serve_app/gateway/route_hooks.py: Anthropic's on the
    Messages routes), as the ImmediateResponse Envoy answers with (Envoy sets the length)."""
    headers = {k: v for k, v in response.headers.items() if k != "content-length"}
    return immediate(response.status_code, bytes(response.body), headers)
