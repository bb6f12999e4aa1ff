"""Ray EPP's scheduling framework in plain Python (no Ray): GIE / llm-d multi-cycle scheduling.

from scheduler import load_config, Scheduler, Endpoint, Metrics, LLMRequest, SchedulingError
sched = Scheduler.from_config(load_config(yaml_text))
result = sched.schedule(request, endpoints)
"""

from scheduler.config import EndpointPickerConfig, build_plugins, dump_config, load_config, load_config_file
from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey, RequestData
from scheduler.errors import ConfigError, ErrorCode, SchedulingError
from scheduler.interfaces import (
    Filter,
    Parameters,
    PDDecider,
    Picker,
    Plugin,
    PluginHandle,
    PreRequest,
    Producer,
    ProfileHandler,
    Responder,
    ResponseComplete,
    ResponseFirstToken,
    ResponseHeader,
    ResponseUsage,
    SaturationDetector,
    Scorer,
    ScorerCategory,
    Screener,
    TentativePreRequest,
)
from scheduler.loop import schedule_cycles
from scheduler.profile import SchedulerProfile, WeightedScorer
from scheduler.registry import plugin_class, plugin_types, register
from scheduler.scheduler import Scheduler, run_profile
from scheduler.trace import ProfileTrace, SchedulingTrace
from scheduler.types import (
    Endpoint,
    LLMRequest,
    Metrics,
    ProfileRunResult,
    SchedulingResult,
    ScoredEndpoint,
    ServedModel,
)

__all__ = [
    "ConfigError",
    "CycleState",
    "DataKey",
    "Endpoint",
    "EndpointPickerConfig",
    "ErrorCode",
    "Filter",
    "LLMRequest",
    "Metrics",
    "PDDecider",
    "Parameters",
    "Picker",
    "Plugin",
    "PluginHandle",
    "PreRequest",
    "Producer",
    "ProfileHandler",
    "ProfileRunResult",
    "ProfileTrace",
    "RequestData",
    "Responder",
    "ResponseComplete",
    "ResponseFirstToken",
    "ResponseHeader",
    "ResponseUsage",
    "SaturationDetector",
    "Scheduler",
    "SchedulerProfile",
    "SchedulingError",
    "SchedulingResult",
    "SchedulingTrace",
    "ScoredEndpoint",
    "Scorer",
    "ScorerCategory",
    "Screener",
    "ServedModel",
    "TentativePreRequest",
    "WeightedScorer",
    "build_plugins",
    "dump_config",
    "load_config",
    "load_config_file",
    "plugin_class",
    "plugin_types",
    "register",
    "run_profile",
    "schedule_cycles",
]
