import sys

from ray_epp.simulator.cli import main

sys.exit(main())
