"""`pd-profile-handler`: llm-d's older name for the P/D handler, kept so older configs load as
written. It is `disagg-profile-handler` with pd-profile-handler's parameters and defaults:

* `decodeProfile` / `prefillProfile` (default `decode` / `prefill`);
* `deciderPluginName` (default `prefix-based-pd-decider`: used when a plugin of that name is
  configured);
* `threshold` (before llm-d had deciders): > 0 decides as `prefix-based-pd-decider` with
  `nonCachedTokens: <threshold>`; 0 disaggregates every request, as that handler did. Without a
  decider plugin of the default name and without `threshold`, that is also the default;
* `hashBlockSize`, `prefixPluginType`, `prefixPluginName`, `primaryPort`: checked and ignored (the
  block size comes from the prefix-cache scorer's match info; primaryPort was an Istio workaround
  for vLLM data parallelism that a gateway forwarding to each rank's own port does not need)."""

from __future__ import annotations

from scheduler.interfaces import PDDecider, PluginHandle
from scheduler.plugins.handlers.disagg import DisaggProfileHandler
from scheduler.registry import register

DEFAULT_DECIDER_PLUGIN = "prefix-based-pd-decider"


@register
class PdProfileHandler(DisaggProfileHandler):
    type_name = "pd-profile-handler"

    def _default_decider(self, handle: PluginHandle, stage: str) -> PDDecider | None:
        if stage != "prefill":
            return None
        threshold = self.params.threshold
        if threshold is None and DEFAULT_DECIDER_PLUGIN in handle.plugin_names():
            return self._resolve_decider(handle, DEFAULT_DECIDER_PLUGIN, "deciderPluginName")
        return self.threshold_decider(threshold or 0)
