"""The `epp` command line: pick, validate, sim, bench, up, pods — the one place that wires every layer.

`pick` and `validate` live here and need only the scheduler. `sim`, `bench` and `up` come from
their own modules (ray_epp/simulator/cli.py, bench/cli.py, serve_app/cli/up.py), each imported only when it is
the command being run, so `epp pick` starts without the simulator, the benchmarks or Ray. A command
whose module (or a module it needs) cannot be imported is not dropped from the list: running it
says which command and which module, and exits 2."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

EXIT_CANNOT_LOAD = 2  # as argparse exits on a usage error


def _sim_module() -> ModuleType:
    from ray_epp.simulator import cli

    return cli


def _bench_module() -> ModuleType:
    """The lab's command line, from the source checkout this package runs from (an editable
    install: the lab is beside `serve_app/` but not installed); a wheel has no lab, and another
    distribution's `bench` is never imported in its place."""
    checkout = Path(__file__).resolve().parents[2]  # serve_app/cli/commands.py -> the checkout
    if not (checkout / "bench" / "cli.py").is_file():
        raise LabNotInstalled(
            "the benchmark lab is not part of the installed package: run `epp bench` from a source "
            "checkout (git clone, then `make test` or `pip install -e '.[dev,bench]'`)"
        )
    if str(checkout) not in sys.path:
        sys.path.append(str(checkout))
    from bench import cli

    return cli


class LabNotInstalled(ImportError):
    """A command of the source tree's lab, run from an installed wheel."""


def _up_module() -> ModuleType:
    from serve_app.cli import up

    return up


def _pods_module() -> ModuleType:
    from serve_app.cli import pods as pods_cli

    return pods_cli


def _explain_module() -> ModuleType:
    from serve_app.cli import explain

    return explain


@dataclass(frozen=True, slots=True)
class Subcommand:
    """A command another module provides, as `add_<name>_arguments(parser)` and `run_<name>(args)`."""

    name: str
    help: str
    load: Callable[[], ModuleType]


SUBCOMMANDS = (
    Subcommand("sim", "run simulated vLLM pods on 127.0.0.1", _sim_module),
    Subcommand("bench", "routing-quality benchmarks (cluster simulation or end to end), with a report", _bench_module),
    Subcommand("up", "start the gateway (default: local Ray, 4 simulated pods, the default config)", _up_module),
    Subcommand("pods", "list, add or remove a running gateway's pods (its admin route, admin_token)", _pods_module),
    Subcommand("explain", "why a request went where it went: a running gateway's decision record", _explain_module),
)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="epp", description="Ray EPP: an endpoint picker for LLM inference on Ray.")
    parser.add_argument("--version", action="version", version=f"epp (ray-epp) {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    pick = sub.add_parser("pick", help="schedule one request on given endpoints, in-process, and print the decision")
    pick.add_argument("--config", required=True, help="EndpointPickerConfig: a shipped config's name, a path or YAML")
    pick.add_argument("--endpoints", required=True, help="JSON list of endpoints with metrics")
    pick.add_argument("--request", required=True, help="JSON request")
    pick.add_argument("--trace", action="store_true", help="also print the decision trace")
    pick.set_defaults(func=_cmd_pick)

    validate = sub.add_parser("validate", help="print a config after GIE's defaults, or its errors")
    validate.add_argument("config", help="EndpointPickerConfig: a shipped config's name (default, pd, ...), path, YAML")
    validate.set_defaults(func=_cmd_validate)

    configs = sub.add_parser("configs", help="list the shipped configs by name, or print one (epp configs pd)")
    configs.add_argument("name", nargs="?", help="print this shipped config's YAML")
    configs.set_defaults(func=_cmd_configs)

    env = sub.add_parser("env", help="the shell line that points Ray's tools at a running `epp up`'s cluster")
    env.add_argument("--port", type=int, default=None, help="the gateway port of that `epp up` (default: the only one)")
    env.set_defaults(func=_cmd_env)

    examples = sub.add_parser("examples", help="copy the shipped examples (pods file, Serve configs) into a folder")
    examples.add_argument("dest", help="folder to copy them into (created; existing files are not overwritten)")
    examples.set_defaults(func=_cmd_examples)

    for command in SUBCOMMANDS:
        cmd_parser = sub.add_parser(command.name, help=command.help)
        if argv[:1] != [command.name]:
            continue  # not the one being run: listed in the help, not imported
        try:
            module = command.load()
        except ImportError as err:
            return _cannot_load(command, err)
        getattr(module, f"add_{command.name}_arguments")(cmd_parser)
        cmd_parser.set_defaults(func=getattr(module, f"run_{command.name}"))

    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `epp validate pd | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _cannot_load(command: Subcommand, err: ImportError) -> int:
    if isinstance(err, LabNotInstalled):
        print(f"epp {command.name}: {err}", file=sys.stderr)
        return EXIT_CANNOT_LOAD
    missing = err.name or "?"
    print(
        f"epp {command.name}: cannot load this command: module {missing!r} is missing or broken ({err}).\n"
        "Install the project with its dependencies (pip install -e . in the repository, or make run).",
        file=sys.stderr,
    )
    return EXIT_CANNOT_LOAD


def _read_json(path: str, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"can not read {what} file {path!r}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{what} file {path!r} is not valid JSON: {err}") from None


def _print_error(code: str, message: str) -> int:
    print(json.dumps({"error": {"code": code, "message": message}}))
    return 1


def _cmd_pick(args: argparse.Namespace) -> int:
    from scheduler import ConfigError, Endpoint, LLMRequest, Scheduler, SchedulingError, load_config_file
    from scheduler.trace import SchedulingTrace

    try:
        cfg = load_config_file(args.config)
        raw_endpoints = _read_json(args.endpoints, "endpoints")
        if not isinstance(raw_endpoints, list):
            raise ValueError("the endpoints file must hold a JSON list of endpoints")
        endpoints = [Endpoint.from_json(e) for e in raw_endpoints]
        request = LLMRequest.from_json(_read_json(args.request, "request"))
    except ConfigError as err:
        return _print_error("BadRequest", str(err))
    except SchedulingError as err:
        return _print_error(err.code.value, err.message)
    except (ValueError, TypeError) as err:
        return _print_error("BadRequest", str(err))
    trace = SchedulingTrace() if args.trace else None
    try:
        sched = Scheduler.from_config(cfg)
        if sched.preparers:  # a burst window: one request alone in it
            result = asyncio.run(sched.aschedule(request, endpoints, trace=trace))
        else:
            result = sched.schedule(request, endpoints, trace=trace)
    except SchedulingError as err:
        out = err.to_json()
        if trace is not None:
            out["trace"] = trace.to_json()
        print(json.dumps(out))
        return 1
    out = result.to_json()
    if trace is not None:
        out["trace"] = trace.to_json()
    print(json.dumps(out))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    """What runs, what is refused and why (as YAML comments), then the effective config; or the errors."""
    import yaml

    from scheduler import ConfigError, dump_config
    from scheduler.config.report import config_report_file

    report = config_report_file(args.config)
    summary = report.text()
    if report.config is None:
        if summary:
            print(summary, file=sys.stderr)
        print(str(ConfigError(report.errors)), file=sys.stderr)
        return 1
    if summary:
        print("\n".join(f"# {line}" for line in summary.splitlines()))
    print(_routes_comment())
    print(yaml.safe_dump(dump_config(report.config), sort_keys=False), end="")
    return 0


def _routes_comment() -> str:
    """The gateway's routes and how each is scheduled (serve_app/gateway/api_views.py), as YAML comments."""
    from serve_app.gateway.api_views import ROUTE_TABLE

    return "\n".join(["# routes (how the gateway schedules each):", *(f"#   {r}: {how}" for r, how in ROUTE_TABLE)])


def _version() -> str:
    from ray_epp import __version__

    return __version__


def _cmd_configs(args: argparse.Namespace) -> int:
    from scheduler.config.source import config_source, shipped_config_names

    names = shipped_config_names()
    if args.name is None:
        print("\n".join(names))
        return 0
    if args.name not in names:
        print(f"epp configs: no shipped config {args.name!r} (shipped: {', '.join(names)})", file=sys.stderr)
        return 1
    print(config_source(args.name)[0], end="")
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    """`eval "$(epp env)"`: RAY_ADDRESS and the settings Ray's tools need for `epp up`'s cluster."""
    from serve_app.admin.operator_access import running_accesses

    running = running_accesses()
    if args.port is not None:
        running = {p: a for p, a in running.items() if p == args.port}
    if len(running) != 1:
        which = f"on port {args.port}" if args.port is not None else "of this user"
        if running:
            ports = ", ".join(str(p) for p in sorted(running))
            print(f"epp env: several `epp up` are running (gateway ports {ports}): name one with --port",
                  file=sys.stderr)  # fmt: skip
        else:
            print(f"epp env: no `epp up` {which} is running (one that joined a cluster with --address "
                  "leaves that cluster's settings as they are)", file=sys.stderr)  # fmt: skip
        return 1
    (access,) = running.values()
    print(access.shell_line())
    return 0


def _cmd_examples(args: argparse.Namespace) -> int:
    """The shipped examples as files a user can edit; never overwrites one."""
    from importlib import resources

    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for item in sorted(resources.files("ray_epp.examples").iterdir(), key=lambda p: p.name):
        if item.name.startswith("_") or not item.name.endswith((".py", ".yaml", ".json")):
            continue
        target = dest / item.name
        if target.exists():
            kept.append(item.name)
            continue
        target.write_bytes(item.read_bytes())
        copied.append(item.name)
    print(f"copied to {dest.resolve()}: {', '.join(copied) or 'nothing'}")
    if kept:
        print(f"kept (already there): {', '.join(kept)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
