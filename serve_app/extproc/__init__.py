"""GIE's Endpoint Picker Protocol (Envoy ext_proc over gRPC): the gateway's second front door.

Envoy (or any data plane that speaks ext_proc) asks a gateway replica to pick an endpoint for
each request; the replica runs the same request path as its HTTP door (`GatewayCore`: admission,
flow control, the multi-cycle loop, the plugins' hooks) and answers with the pick instead of
forwarding the request. docs/EXT_PROC.md is the user's guide.

* `protocol.py` — the protocol's names and message shapes (xds-protos' Envoy classes);
* `stream.py` — one request's stream, message by message;
* `service.py` — the ExternalProcessor and gRPC health services;
* `server.py` — the replica's gRPC server on the shared ext_proc port."""
