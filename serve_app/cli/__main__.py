"""`python -m serve_app.cli ...` is `epp ...`."""

import sys

from serve_app.cli.commands import main

sys.exit(main())
