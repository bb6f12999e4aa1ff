"""The `epp` command line, the composition root: the one place that wires every layer together
(`commands.py` every subcommand, `up.py` and `launch.py` for `epp up`, `pods.py` for pods files)."""

from serve_app.cli.commands import main

__all__ = ["main"]
