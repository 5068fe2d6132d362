"""`python -m fastcoll.launch ...` is `fastcoll-launch ...`."""

import sys

from fastcoll.launch.cli import main

sys.exit(main())
