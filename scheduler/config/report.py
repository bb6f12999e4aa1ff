"""What `epp validate` shows: for every plugin and section field a config sets, whether Ray EPP runs
it (its roles, and where it runs: scheduler/config/placement.py), refuses it (and why, from
scheduler/config/refused.py and sections.py), or does not know it; whether the gateway setting
`decide_in_replica` can run it; then the loader's own verdict.
A report never raises: a config that can not load still gets one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scheduler.config.build import build_plugins
from scheduler.config.loader import load_config, parse_config, read_config_file
from scheduler.config.models import EndpointPickerConfig
from scheduler.config.placement import DecideIn, Placement, needs_actor, placement
from scheduler.config.refused import refusal
from scheduler.config.sections import section_statuses
from scheduler.errors import ConfigError
from scheduler.interfaces import Plugin, roles_of
from scheduler.registry import plugin_class


@dataclass(slots=True, frozen=True)
class ReportLine:
    where: str  # "plugin 'name' (type t)" or a section field
    status: str  # "runs" | "accepted" | "refused" | "unknown"
    why: str


@dataclass(slots=True)
class ConfigReport:
    lines: list[ReportLine] = field(default_factory=list)
    config: EndpointPickerConfig | None = None  # loaded, defaults applied; None when it does not load
    errors: list[str] = field(default_factory=list)

    def text(self) -> str:
        width = max((len(line.status) for line in self.lines), default=0)
        return "\n".join(f"{line.status:<{width}}  {line.where}: {line.why}" for line in self.lines)


def config_report_file(path: str | Path) -> ConfigReport:
    try:
        return config_report(read_config_file(path))
    except ConfigError as err:
        return ConfigReport(errors=list(err.errors))


def config_report(source: str | dict) -> ConfigReport:
    report = ConfigReport()
    try:
        raw = parse_config(source)
    except ConfigError as err:
        report.errors = list(err.errors)
        return report
    classes: dict[str, type[Plugin]] = {}
    runs: dict[str, int] = {}  # plugin name -> its line
    for spec in raw.plugins:
        name = spec.name or spec.type
        where = f"plugin {name!r} (type {spec.type})"
        cls = plugin_class(spec.type)
        if cls is not None:
            classes[name] = cls
            roles = roles_of(cls)
            what = ", ".join(roles) if roles else "no scheduling role (read by other plugins, gateway or actors)"
            runs[name] = len(report.lines)
            report.lines.append(ReportLine(where, "runs", what))
        elif (why := refusal(spec.type)) is not None:
            report.lines.append(ReportLine(where, "refused", why))
        else:
            report.lines.append(ReportLine(where, "unknown", "no plugin of this type in Ray EPP or llm-d"))
    for s in section_statuses(raw, classes):
        report.lines.append(ReportLine(s.field, "accepted" if s.accepted else "refused", s.why))
    try:
        report.config = load_config(source)
    except ConfigError as err:
        report.errors = list(err.errors)
        return report
    built = build_plugins(report.config)
    for name, places in built.placement.items():  # where each one runs
        where = ", ".join(p.value for p in Placement if p in places) or "nowhere (nothing uses it)"
        if name in runs:
            line = report.lines[runs[name]]
            report.lines[runs[name]] = ReportLine(line.where, line.status, f"{line.why}; runs in: {where}")
        else:  # a producer the config did not declare, made with its defaults for its consumers
            plugin = built.plugins[name]
            roles = ", ".join(roles_of(type(plugin)))
            report.lines.append(ReportLine(
                f"plugin {name!r} (type {plugin.type_name})", "runs",
                f"{roles}; not declared: made with its defaults for the plugins that read it; runs in: {where}",
            ))  # fmt: skip
    in_replica = placement(built.plugins, report.config, built.uses, built.profiles, DecideIn.REPLICA)
    need = needs_actor(built.plugins, in_replica)
    why = "; ".join(f"{name} {reason}" for name, reason in need.items())
    report.lines.append(ReportLine(
        "gateway setting decide_in_replica",
        "refused" if need else "accepted",
        f"needs the profile actors: {why}" if need else "the gateway replica runs every profile, no profile actor",
    ))  # fmt: skip
    return report
