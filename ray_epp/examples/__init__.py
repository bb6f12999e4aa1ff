"""Examples shipped with Ray EPP: a pods file, a Serve config for the gateway, Ray Serve LLM with
EPPRequestRouter (`python -m ray_epp.examples.serve_llm`), and `epp pick`'s endpoints and request.

`epp examples DIR` copies them into DIR to edit."""
