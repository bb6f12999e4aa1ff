"""Built-in data producers (llm-d's request-control data producers), one per module: plugins that
compute per-request endpoint data which scorers and deciders read, outside any profile."""
