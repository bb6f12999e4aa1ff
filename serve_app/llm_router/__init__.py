"""Ray EPP as a Ray Serve LLM request router (`EPPRequestRouter`): Serve keeps the data plane, Ray
EPP picks the replica. `router.py` is the router; the rest are its rooms (replica endpoints and
their scraped stats, the mirror of the profile actors' plugins, first-token inference, config).

The public names are re-exported here: `request_router_class="serve_app.llm_router:EPPRequestRouter"`."""

from serve_app.llm_router import router as _router
from serve_app.llm_router.router import *  # noqa: F403  (the router's public names, as its __all__ lists them)

__all__ = list(_router.__all__)
