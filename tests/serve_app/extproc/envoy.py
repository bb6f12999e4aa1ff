"""Envoy's side of an ext_proc stream, message by message, for the tests and the benchmark: what
Envoy's ext_proc filter sends in FULL_DUPLEX_STREAMED mode for request and response bodies
(request headers, body chunks with end_of_stream, response headers, response body chunks), with
`xds-protos`' message classes; then the request really goes to the endpoint the picker returned
(a simulated pod on 127.0.0.1), as Envoy's ORIGINAL_DST cluster would send it, and the response
goes back through the stream."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

from serve_app.extproc.protocol import DESTINATION_KEY, LB_NAMESPACE, SERVED_KEY, SUBSET_KEY, SUBSET_NAMESPACE

_END = object()


def headers_message(headers: dict[str, str], end_of_stream: bool = False) -> pb.HttpHeaders:
    values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values), end_of_stream=end_of_stream)


def metadata(namespace: str, key: str, value: Any) -> base_pb2.Metadata:
    meta = base_pb2.Metadata()
    struct = struct_pb2.Struct()
    struct.update({key: value})
    meta.filter_metadata[namespace].CopyFrom(struct)
    return meta


class Stream:
    """One ext_proc stream as Envoy holds it: messages go out one at a time, answers are read one
    at a time."""

    def __init__(self, stub: pb_grpc.ExternalProcessorStub, timeout_s: float = 60.0) -> None:
        self._out: queue.Queue = queue.Queue()
        self._answers: Iterator[pb.ProcessingResponse] = stub.Process(iter(self._out.get, _END), timeout=timeout_s)
        self.received = 0  # answers read: none yet means the picker had not started answering

    def send(self, msg: pb.ProcessingRequest) -> None:
        self._out.put(msg)

    def recv(self) -> pb.ProcessingResponse:
        answer = next(self._answers)
        self.received += 1
        return answer

    def half_close(self) -> None:
        self._out.put(_END)

    def cancel(self) -> None:
        self._answers.cancel()  # type: ignore[attr-defined]

    def rest(self) -> list[pb.ProcessingResponse]:
        """What the picker still sends once Envoy has half-closed (nothing, normally)."""
        return list(self._answers)


@dataclass
class Outcome:
    """What one request through the picker came to."""

    immediate_status: int | None = None
    immediate_body: bytes = b""
    immediate_headers: dict[str, str] = field(default_factory=dict)
    destination: str = ""  # the header Envoy routes on: the pick, then fallbacks
    metadata_destination: str = ""  # the same in envoy.lb dynamic metadata
    request_set: dict[str, str] = field(default_factory=dict)  # request headers the picker set
    request_removed: list[str] = field(default_factory=list)
    forwarded_body: bytes = b""
    status: int = 0  # the model server's answer
    response_set: dict[str, str] = field(default_factory=dict)
    body: bytes = b""  # the response body as the picker passed it back

    @property
    def endpoint(self) -> str:
        return self.destination.split(",")[0]


def _mutation(m: pb.HeaderMutation) -> dict[str, str]:
    return {h.header.key: (h.header.raw_value.decode() or h.header.value) for h in m.set_headers}


def decide(
    stream: Stream,
    path: str,
    body: bytes | None,
    headers: dict[str, str] | None = None,
    subset: list[str] | None = None,
    chunks: int = 3,
    method: str = "POST",
    pause_s: float = 0.0,
) -> Outcome:
    """The request phase: headers, the body in `chunks` pieces (the last with end_of_stream), and
    the picker's answers up to the end of the (echoed) body, or its ImmediateResponse. A request
    without a body (`body` None: a GET, a DELETE) is its headers alone, with end_of_stream.
    `pause_s`: the client's upload is slow, Envoy streams what came before the last chunk."""
    hdrs = {":method": method, ":path": path, ":authority": "gateway.local", ":scheme": "http"}
    if body is not None:
        hdrs |= {"content-type": "application/json", "content-length": str(len(body))}
    hdrs |= headers or {}
    meta = metadata(SUBSET_NAMESPACE, SUBSET_KEY, subset) if subset is not None else None
    first = pb.ProcessingRequest(request_headers=headers_message(hdrs, end_of_stream=body is None))
    if meta is not None:
        first.metadata_context.CopyFrom(meta)
    stream.send(first)
    if body is not None:
        size = max(1, -(-len(body) // chunks))
        pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
        for i, piece in enumerate(pieces):
            end = i == len(pieces) - 1
            if end and pause_s:
                time.sleep(pause_s)
            stream.send(pb.ProcessingRequest(request_body=pb.HttpBody(body=piece, end_of_stream=end)))
    out = Outcome()
    answer = stream.recv()
    if answer.WhichOneof("response") == "immediate_response":
        imm = answer.immediate_response
        out.immediate_status = imm.status.code
        out.immediate_body = imm.body
        out.immediate_headers = _mutation(imm.headers)
        return out
    assert answer.WhichOneof("response") == "request_headers", answer
    mutation = answer.request_headers.response.header_mutation
    out.request_set = _mutation(mutation)
    out.request_removed = list(mutation.remove_headers)
    out.destination = out.request_set[DESTINATION_KEY]
    lb = answer.dynamic_metadata.fields[LB_NAMESPACE].struct_value
    out.metadata_destination = lb.fields[DESTINATION_KEY].string_value
    if body is None:
        return out
    forwarded = []
    while True:
        answer = stream.recv()
        assert answer.WhichOneof("response") == "request_body", answer
        streamed = answer.request_body.response.body_mutation.streamed_response
        forwarded.append(streamed.body)
        if streamed.end_of_stream:
            break
    out.forwarded_body = b"".join(forwarded)
    return out


def respond(
    stream: Stream,
    out: Outcome,
    path: str,
    headers: dict[str, str] | None = None,
    served: str = "",
    method: str = "POST",
) -> None:
    """The response phase: the request goes to the endpoint Envoy would pick (the first of the
    destination, or `served`), and its answer flows back through the stream, chunk by chunk."""
    target = served or out.endpoint
    hdrs = {"content-type": "application/json", **(headers or {}), **out.request_set}
    hdrs = {k: v for k, v in hdrs.items() if k not in out.request_removed}
    content = out.forwarded_body if method == "POST" else None
    with (
        httpx.Client(timeout=60) as http,
        http.stream(method, f"http://{target}{path}", content=content, headers=hdrs) as resp,
    ):
        out.status = resp.status_code
        resp_headers = {":status": str(resp.status_code), **{k.lower(): v for k, v in resp.headers.items()}}
        msg = pb.ProcessingRequest(response_headers=headers_message(resp_headers))
        msg.metadata_context.CopyFrom(metadata(LB_NAMESPACE, SERVED_KEY, target))
        stream.send(msg)
        answer = stream.recv()
        assert answer.WhichOneof("response") == "response_headers", answer
        out.response_set = _mutation(answer.response_headers.response.header_mutation)
        got = []
        for chunk in resp.iter_raw():
            stream.send(pb.ProcessingRequest(response_body=pb.HttpBody(body=chunk, end_of_stream=False)))
            got.append(_body_answer(stream))
        stream.send(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"", end_of_stream=True)))
        got.append(_body_answer(stream))
        out.body = b"".join(got)


def _body_answer(stream: Stream) -> bytes:
    answer = stream.recv()
    assert answer.WhichOneof("response") == "response_body", answer
    return answer.response_body.response.body_mutation.streamed_response.body


def through_envoy(
    stub: pb_grpc.ExternalProcessorStub,
    path: str,
    body: bytes | None,
    headers: dict[str, str] | None = None,
    subset: list[str] | None = None,
    method: str = "POST",
) -> Outcome:
    """A whole request through the picker, as Envoy carries it."""
    stream = Stream(stub)
    try:
        out = decide(stream, path, body, headers, subset, method=method)
        if out.immediate_status is None:
            respond(stream, out, path, headers, method=method)
        stream.half_close()
        assert stream.rest() == []
        return out
    finally:
        stream.cancel()


def stub_for(address: str) -> tuple[grpc.Channel, pb_grpc.ExternalProcessorStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.ExternalProcessorStub(channel)
