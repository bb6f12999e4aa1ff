"""How `epp` loads its subcommands: each only when it runs, and a broken install says what is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from serve_app.cli.commands import SUBCOMMANDS, main
from serve_app.cli.launch import DEFAULT_CONFIG

ROOT = Path(__file__).resolve().parents[2]


def epp(*args: str, block: str | None = None) -> subprocess.CompletedProcess[str]:
    """`epp ARGS` in a fresh interpreter; `block` makes importing that module fail, as it would in
    an install that lacks it (Python's own way: a None in sys.modules)."""
    code = "import sys\n"
    if block:
        code += f"sys.modules[{block!r}] = None\n"
    code += f"from serve_app.cli.commands import main\nsys.exit(main({list(args)!r}))\n"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in ("pick", "validate", *(c.name for c in SUBCOMMANDS)):
        assert name in out


@pytest.mark.parametrize(
    ("command", "args", "blocked"),
    [
        ("sim", ["--pods", "1"], "aiohttp"),  # a dependency of the simulator's HTTP server
        ("bench", ["list"], "bench.cli"),  # the command's own module
        ("up", ["--exit-after", "0"], "serve_app.cli.launch"),
    ],
)
def test_a_command_that_cannot_be_imported_names_itself_and_the_missing_module(command, args, blocked):
    result = epp(command, *args, block=blocked)
    assert result.returncode == 2, result.stderr
    assert f"epp {command}:" in result.stderr
    assert repr(blocked) in result.stderr


def test_the_other_commands_still_run_when_one_cannot_be_imported():
    result = epp("validate", DEFAULT_CONFIG, block="aiohttp")
    assert result.returncode == 0, result.stderr
    assert "schedulingProfiles" in result.stdout


def test_pick_and_validate_do_not_import_the_other_commands():
    code = (
        "import sys\nfrom serve_app.cli.commands import main\n"
        f"main(['validate', {DEFAULT_CONFIG!r}])\n"
        "lazy = ('ray', 'ray_epp.simulator.cli', 'bench.cli', 'serve_app.cli.up')\n"
        "print('LOADED', sorted(m for m in lazy if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "LOADED []"


def test_a_loaded_command_gets_its_own_arguments(capsys):
    with pytest.raises(SystemExit):
        main(["up", "--help"])
    out = capsys.readouterr().out
    assert "--sim-pods" in out and DEFAULT_CONFIG in out  # the one default config


def test_the_lab_runs_from_a_source_checkout_whatever_the_working_directory():
    """The lab is not installed (the wheel leaves it out); an editable install finds it beside
    `serve_app/`, so `epp bench` works from any folder of a source checkout's user."""
    out = subprocess.run([str(Path(sys.executable).parent / "epp"), "bench", "list"], cwd="/",
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "shared-prefix" in out.stdout
