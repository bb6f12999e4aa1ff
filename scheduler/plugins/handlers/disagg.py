"""`disagg-profile-handler` (llm-d): prefill/decode (and encode) disaggregation as a multi-cycle
profile handler (GIE's multi-cycle scheduler, pkg/epp/scheduling/scheduler.go at e29fa4b2).

Round 1 runs the decode profile. If it found no endpoint, no further stage runs and the request
fails. Otherwise each optional stage, encode then prefill, asks its decider about the decode
target (e.g. "is enough of this prompt uncached there?"); a yes runs that stage's profile in the
next round, a no (or no decider configured) skips it. The result has decode as its primary
profile, plus every stage that ran: a stage that ran and found no endpoint maps to None and the
request is still served by decode alone (no prefill pod is not an error: GIE PR #1013, the reason
ProcessResults decides whether a failed profile fails the request).

Parameters, as llm-d writes them:

    profiles:  {decode: decode, prefill: prefill, encode: encode}   # the profile names (defaults shown)
    deciders:  {prefill: <decider plugin>, encode: <decider plugin>}  # a stage without one never runs

llm-d's deprecated flat form is accepted too (`decodeProfile`, `prefillProfile`, `encodeProfile`,
`prefillDeciderPluginName`, `encodeDeciderPluginName`, `deciderPluginName`), but not mixed with
the nested one, and so are `pd-profile-handler`'s parameters (see pd_profile.py): `threshold` makes
a built-in decider (> 0: prefix-based with nonCachedTokens = threshold; 0: always disaggregate);
`hashBlockSize`, `prefixPluginType`, `prefixPluginName` and `primaryPort` are checked and ignored.

`parallelStages` (true | false | auto, default false) puts decode and every stage whose decider
might say yes (`PDDecider.might_disaggregate`, e.g. the prompt is long enough) in one round; once
decode has its target the deciders decide exactly as above, and a stage they turn down is
discarded: it is not in the result, so no plugin hears of it (PreRequest). A decider with
`parallel_round = False` keeps its stage in a later round. `auto` is on where the profiles of a
round run at the same time (the Ray path's profile actors) and off in-process, where it would only
add work. The default is false: on a 2-core machine one round saved nothing measurable and cost a
wasted prefill run on cached prompts (docs/decisions/0004-parallel-stages-off.md).

Each request's decision (`decode-only`, `prefill-decode`, `encode-decode`, `encode-prefill-decode`,
llm-d's metric values) and what happened to each stage is kept in the CycleState under
DISAGG_DECISION_KEY and shows in a debug trace under "disagg"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from scheduler.cycle_state import CycleState, profile_failure
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import Parameters, PDDecider, PluginHandle, ProfileHandler
from scheduler.loop import CONCURRENT_ROUNDS_KEY
from scheduler.plugins.deciders.always_disagg import AlwaysDisaggPDDecider
from scheduler.plugins.deciders.prefix_based import PrefixBasedPDDecider, PrefixBasedPDDeciderParameters
from scheduler.plugins.support.topology import PEER_ENDPOINT_KEY
from scheduler.registry import register
from scheduler.trace import add_trace_note
from scheduler.types import LLMRequest, ProfileRunResult, SchedulingResult

DEFAULT_DECODE_PROFILE = "decode"
DEFAULT_PREFILL_PROFILE = "prefill"
DEFAULT_ENCODE_PROFILE = "encode"

# CycleState key of this request's decision: {"decision": ..., "decode": ..., "encode": ..., "prefill": ...}.
DISAGG_DECISION_KEY = "disagg/decision"
TRACE_KEY = "disagg"

DECODE_ONLY = "decode-only"
PREFILL_DECODE = "prefill-decode"
ENCODE_DECODE = "encode-decode"
ENCODE_PREFILL_DECODE = "encode-prefill-decode"

# What the decision record says of a stage.
STAGE_PICKED = "picked"  # its decider said yes: the stage runs next
STAGE_RAN = "ran"
STAGE_FAILED = "failed"  # ran and found no endpoint (its result is None)
STAGE_SKIPPED = "skipped"  # its decider said no
STAGE_NO_DECIDER = "no decider"  # its profile is configured but no decider is
# The record's list of the stages that ran in decode's round (parallelStages), whatever was decided.
RAN_WITH_DECODE = "with decode"

_FLAT_FIELDS = {
    "decode_profile": "decodeProfile",
    "prefill_profile": "prefillProfile",
    "encode_profile": "encodeProfile",
    "prefill_decider_plugin_name": "prefillDeciderPluginName",
    "encode_decider_plugin_name": "encodeDeciderPluginName",
    "decider_plugin_name": "deciderPluginName",
}


class StageProfiles(Parameters):
    decode: str = ""
    prefill: str = ""
    encode: str = ""


class StageDeciders(Parameters):
    prefill: str = ""
    encode: str = ""


@dataclass(frozen=True, slots=True)
class Named:
    """A profile or decider name as the parameters give it, and the parameter that gave it (for
    errors); both "" when not set."""

    name: str = ""
    field: str = ""


class DisaggProfileHandlerParameters(Parameters):
    """An empty string means "not set", as Go's zero value in llm-d.

    Three shapes are accepted (nested, llm-d's deprecated flat names, pd-profile-handler's); one
    validator checks they are not mixed and normalises them: `profile(stage)` and `decider(stage)`
    are what the handler reads, whichever shape was written."""

    profiles: StageProfiles = Field(default_factory=StageProfiles)
    deciders: StageDeciders = Field(default_factory=StageDeciders)
    # llm-d's deprecated flat form.
    decode_profile: str = Field(default="", alias="decodeProfile")
    prefill_profile: str = Field(default="", alias="prefillProfile")
    encode_profile: str = Field(default="", alias="encodeProfile")
    prefill_decider_plugin_name: str = Field(default="", alias="prefillDeciderPluginName")
    encode_decider_plugin_name: str = Field(default="", alias="encodeDeciderPluginName")
    decider_plugin_name: str = Field(default="", alias="deciderPluginName")
    # pd-profile-handler's parameters (threshold and hashBlockSize from before llm-d had deciders).
    threshold: int | None = Field(default=None, ge=0)
    hash_block_size: int | None = Field(default=None, alias="hashBlockSize", gt=0)
    prefix_plugin_type: str = Field(default="", alias="prefixPluginType")
    prefix_plugin_name: str = Field(default="", alias="prefixPluginName")
    primary_port: int = Field(default=0, alias="primaryPort", ge=0, le=65535)
    # Run decode and the stages that might run in one round (see the module docstring).
    parallel_stages: bool | Literal["auto"] = Field(default=False, alias="parallelStages")

    _profiles: dict[str, Named] = PrivateAttr(default_factory=dict)
    _deciders: dict[str, Named] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _normalise(self) -> DisaggProfileHandlerParameters:
        flat = [alias for field, alias in _FLAT_FIELDS.items() if getattr(self, field)]
        nested = self.profiles != StageProfiles() or self.deciders != StageDeciders()
        if flat and nested:
            raise ValueError(
                f"cannot mix the deprecated flat parameters {flat} with the nested 'profiles'/'deciders'; "
                "use one format or the other"
            )
        if self.threshold is not None and (
            self.deciders.prefill or self.prefill_decider_plugin_name or self.decider_plugin_name
        ):
            raise ValueError("'threshold' builds the prefill decider; it can not be combined with a named one")
        if nested:
            profiles = {s: (getattr(self.profiles, s), f"profiles.{s}") for s in ("decode", "prefill", "encode")}
            deciders = {s: (getattr(self.deciders, s), f"deciders.{s}") for s in ("prefill", "encode")}
        else:
            profiles = {
                "decode": (self.decode_profile, "decodeProfile"),
                "prefill": (self.prefill_profile, "prefillProfile"),
                "encode": (self.encode_profile, "encodeProfile"),
            }
            deciders = {
                # llm-d: deciderPluginName (pd-profile-handler's name) is the lower-priority alias.
                "prefill": (self.prefill_decider_plugin_name, "prefillDeciderPluginName")
                if self.prefill_decider_plugin_name
                else (self.decider_plugin_name, "deciderPluginName"),
                "encode": (self.encode_decider_plugin_name, "encodeDeciderPluginName"),
            }
        self._profiles = {s: Named(n, f if n else "") for s, (n, f) in profiles.items()}
        self._deciders = {s: Named(n, f if n else "") for s, (n, f) in deciders.items()}
        return self

    def profile(self, stage: str) -> Named:
        """The profile named for `stage` ("decode", "prefill", "encode"), or Named() if none is."""
        return self._profiles[stage]

    def decider(self, stage: str) -> Named:
        """The decider plugin named for `stage` ("prefill", "encode"), or Named() if none is."""
        return self._deciders[stage]


@dataclass(slots=True)
class Stage:
    """An optional stage: its profile, and the decider that decides per request whether it runs."""

    name: str  # "encode" or "prefill"
    profile: str
    profile_field: str  # the parameter that named the profile (for errors), "" when defaulted
    decider: PDDecider | None
    decider_field: str  # the parameter that named the decider, "" when implicit


@register
class DisaggProfileHandler(ProfileHandler):
    type_name = "disagg-profile-handler"
    Parameters = DisaggProfileHandlerParameters

    def setup(self, handle: PluginHandle) -> None:
        p: DisaggProfileHandlerParameters = self.params
        decode = p.profile("decode")
        self.decode_profile = decode.name or DEFAULT_DECODE_PROFILE
        self._decode_field = decode.field

        def stage(name: str, default_profile: str) -> Stage:
            profile, decider = p.profile(name), p.decider(name)
            resolved: PDDecider | None = (
                self._resolve_decider(handle, decider.name, decider.field)
                if decider.name
                else self._default_decider(handle, name)
            )
            return Stage(name, profile.name or default_profile, profile.field, resolved, decider.field)

        # The order in which stages are considered once decode has its endpoint (llm-d's).
        self.stages = (stage("encode", DEFAULT_ENCODE_PROFILE), stage("prefill", DEFAULT_PREFILL_PROFILE))
        self.prefill_profile = self.stages[1].profile
        self.encode_profile = self.stages[0].profile

    # -- deciders --------------------------------------------------------------------------

    def _resolve_decider(self, handle: PluginHandle, name: str, field: str) -> PDDecider:
        try:
            plugin = handle.plugin(name)
        except KeyError:
            raise ValueError(f"parameters.{field}: no plugin named {name!r} in 'plugins'") from None
        if not isinstance(plugin, PDDecider):
            raise ValueError(
                f"parameters.{field}: plugin {name!r} (type {plugin.type_name}) is not a decider "
                "(e.g. prefix-based-pd-decider, always-disagg-pd-decider)"
            )
        return plugin

    def _default_decider(self, handle: PluginHandle, stage: str) -> PDDecider | None:
        """The decider of a stage no parameter names one for: `threshold`'s for prefill, else none."""
        if stage == "prefill" and self.params.threshold is not None:
            return self.threshold_decider(self.params.threshold)
        return None

    def threshold_decider(self, threshold: int) -> PDDecider:
        """pd-profile-handler's `threshold`: > 0 is prefix-based with nonCachedTokens = threshold;
        0 always disaggregates (its handler ran prefill unconditionally then)."""
        name = f"{self.name}/threshold"
        if threshold == 0:
            return AlwaysDisaggPDDecider(name=name)
        return PrefixBasedPDDecider(name=name, params=PrefixBasedPDDeciderParameters(non_cached_tokens=threshold))

    # -- load-time check -------------------------------------------------------------------

    def validate_profiles(self, profile_names: list[str]) -> list[str]:
        configured = set(profile_names)
        errors = []
        if self.decode_profile not in configured:
            where = f"parameters.{self._decode_field}: " if self._decode_field else ""
            errors.append(
                f"{where}the decode profile {self.decode_profile!r} is not a configured scheduling profile "
                f"{profile_names}"
            )
        for stage in self.stages:
            if stage.profile in configured:
                continue
            if stage.profile_field:
                errors.append(
                    f"parameters.{stage.profile_field}: the {stage.name} profile {stage.profile!r} is not a "
                    f"configured scheduling profile {profile_names}"
                )
            elif stage.decider_field:
                errors.append(
                    f"parameters.{stage.decider_field}: a {stage.name} decider is set but there is no "
                    f"{stage.name} profile {stage.profile!r} (name it with profiles.{stage.name})"
                )
        used = [self.decode_profile, *(s.profile for s in self.stages)]
        if len(set(used)) != len(used):
            errors.append(f"the decode, encode and prefill profiles must differ, got {used}")
        unused = [name for name in profile_names if name not in used]
        if unused:
            errors.append(
                f"scheduling profiles {unused} would never run: this handler runs decode {self.decode_profile!r}, "
                f"prefill {self.prefill_profile!r} and encode {self.encode_profile!r}"
            )
        return errors

    # -- ProfileHandler --------------------------------------------------------------------

    def pick(
        self,
        cycle_state: CycleState,
        request: LLMRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileRunResult | None],
    ) -> dict[str, Any]:
        decode = self.decode_profile
        if decode not in results:
            profile = profiles.get(decode)
            if profile is None:
                return {}
            picked = {decode: profile}
            if self.parallel(cycle_state):
                ahead = [s for s in self.stages if self._may_run_ahead(s, cycle_state, request, profiles)]
                if ahead:
                    self._record(cycle_state)[RAN_WITH_DECODE] = [s.name for s in ahead]
                    picked.update((s.profile, profiles[s.profile]) for s in ahead)
            return picked
        record = self._record(cycle_state)
        decode_result = results[decode]
        if decode_result is None or not decode_result.target_endpoints:
            record["decode"] = STAGE_FAILED  # what ran beside it is discarded with it
            return {}
        record["decode"] = STAGE_RAN
        target = decode_result.target_endpoints[0]
        ahead = record.get(RAN_WITH_DECODE, ())
        for stage in self.stages:
            ran_ahead = stage.name in ahead
            if (stage.profile in results and not ran_ahead) or stage.name in record or stage.profile not in profiles:
                continue  # ran already, already decided, or not configured
            if stage.decider is None:
                record[stage.name] = STAGE_NO_DECIDER
            elif stage.decider.disaggregate(cycle_state, request, target):
                record[stage.name] = STAGE_PICKED
                if not ran_ahead:
                    cycle_state.write(PEER_ENDPOINT_KEY, target)  # llm-d's peer-endpoint, for topology plugins
                    return {stage.profile: profiles[stage.profile]}
            else:
                record[stage.name] = STAGE_SKIPPED  # if it ran beside decode, its result is discarded
        # Every stage is done: what ran, and the decision as llm-d counts it.
        used = {}
        for stage in self.stages:
            if _kept(stage, record, results):
                ok = results[stage.profile] is not None
                record[stage.name] = STAGE_RAN if ok else STAGE_FAILED
                used[stage.name] = ok
        record["decision"] = decision_type(used.get("encode", False), used.get("prefill", False))
        return {}

    def parallel(self, cycle_state: CycleState) -> bool:
        """Whether this request's stages may run in decode's round (parallelStages)."""
        mode = self.params.parallel_stages
        return bool(cycle_state.read(CONCURRENT_ROUNDS_KEY, False)) if mode == "auto" else mode

    @staticmethod
    def _may_run_ahead(
        stage: Stage, cycle_state: CycleState, request: LLMRequest, profiles: Mapping[str, Any]
    ) -> bool:
        decider = stage.decider
        return (
            decider is not None
            and decider.parallel_round
            and stage.profile in profiles
            and decider.might_disaggregate(cycle_state, request)
        )

    @staticmethod
    def _record(cycle_state: CycleState) -> dict[str, Any]:
        record = cycle_state.read(DISAGG_DECISION_KEY)
        if record is None:
            record = {}
            cycle_state.write(DISAGG_DECISION_KEY, record)
            add_trace_note(cycle_state, TRACE_KEY, record)
        return record

    def process_results(
        self, cycle_state: CycleState, request: LLMRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        decode = self.decode_profile
        decode_result = results.get(decode)
        if decode_result is None or not decode_result.target_endpoints:
            if decode not in results:
                raise SchedulingError(ErrorCode.INTERNAL, f"the decode profile {decode!r} did not run")
            cause = profile_failure(cycle_state, decode)
            raise SchedulingError(cause.code, f"failed to find available decode workers: {cause.message}")
        record = cycle_state.read(DISAGG_DECISION_KEY) or {}
        joined: dict[str, ProfileRunResult | None] = {decode: decode_result}
        for stage in self.stages:
            if _kept(stage, record, results):  # a stage that ran and failed stays, as None (GIE PR #1013)
                joined[stage.profile] = results[stage.profile]
        return SchedulingResult(joined, decode, prefill_profile_name=self.prefill_profile)


def _kept(stage: Stage, record: Mapping[str, Any], results: Mapping[str, ProfileRunResult | None]) -> bool:
    """Whether a stage's result belongs to the decision: it ran, and was not run beside decode and
    then turned down by its decider."""
    return stage.profile in results and record.get(stage.name) != STAGE_SKIPPED


def decision_type(encode_used: bool, prefill_used: bool) -> str:
    """llm-d's disaggregation decision label for what actually ran."""
    if encode_used:
        return ENCODE_PREFILL_DECODE if prefill_used else ENCODE_DECODE
    return PREFILL_DECODE if prefill_used else DECODE_ONLY
