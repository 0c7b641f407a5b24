"""`python3 -m kvarn_report RUN_DIR [--out DIR]` (what `kvarn-eval report` runs)."""

import sys

from . import main

sys.exit(main())
