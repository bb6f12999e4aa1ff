"""The `epp` command line: pick, validate, sim, bench, up.

Each subcommand imports what it needs when it runs, so `epp pick` starts without Ray."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="epp", description="Ray EPP: an endpoint picker for LLM inference on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)

    pick = sub.add_parser("pick", help="schedule one request on given endpoints, in-process, and print the decision")
    pick.add_argument("--config", required=True, help="EndpointPickerConfig YAML")
    pick.add_argument("--endpoints", required=True, help="JSON list of endpoints with metrics")
    pick.add_argument("--request", required=True, help="JSON request")
    pick.add_argument("--trace", action="store_true", help="also print the decision trace")
    pick.set_defaults(func=_cmd_pick)

    validate = sub.add_parser("validate", help="print a config after GIE's defaults, or its errors")
    validate.add_argument("config", help="EndpointPickerConfig YAML")
    validate.set_defaults(func=_cmd_validate)

    _add_optional_commands(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


# Subcommands other packages provide: (name, module with add_<name>_arguments/run_<name>, help).
# Looked up by name so that `epp pick` starts without importing them (or Ray).
OPTIONAL_COMMANDS = (
    ("sim", "simulator.cli", "run simulated vLLM pods on 127.0.0.1"),
    ("bench", "bench.cli", "routing-quality benchmarks (cluster simulation or end to end), with a report"),
    ("up", "serve_app.up", "start the gateway (default: local Ray, 4 simulated pods, configs/default.yaml)"),
)


def _add_optional_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands from the other layers; each registers its own arguments."""
    for name, module_name, help_text in OPTIONAL_COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cmd = sub.add_parser(name, help=help_text)
        getattr(module, f"add_{name}_arguments")(cmd)
        cmd.set_defaults(func=getattr(module, f"run_{name}"))


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
        result = Scheduler.from_config(cfg).schedule(request, endpoints, trace=trace)
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
    import yaml

    from scheduler import ConfigError, dump_config, load_config_file

    try:
        cfg = load_config_file(args.config)
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return 1
    print(yaml.safe_dump(dump_config(cfg), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
