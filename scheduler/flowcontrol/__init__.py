"""GIE / llm-d flow control in plain Python: priority bands, flows, ordering and fairness
policies, capacity limits, a queue-wait TTL, and dispatch gated by the saturation detectors.

No Ray and no asyncio: the controller reads a clock and reports each request's outcome through a
callback, so the gateway drives it in real time and the cluster simulation in virtual time.
`types` (what is queued) imports nothing of the framework, so the plugin interfaces can name it;
`controller` holds the queue."""
