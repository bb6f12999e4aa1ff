"""The HTTP gateway and the request path both front doors share: `core.py` (`GatewayCore`: admit,
schedule, forward, tell the plugins), `deployment.py` (the Ray Serve deployment and its routes),
and the rooms they use (intake, parsing, flow control, forwarding, P/D hand-off, metrics, traces)."""
