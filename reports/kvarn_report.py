#!/usr/bin/env python3
"""kvarn-eval report: python3 reports/kvarn_report.py RUN_DIR [--out DIR]

Writes report.html, report.md, figures/*.png|pdf and tables/*.tex|md|html for a run directory
(default output: RUN_DIR/report/).  Needs Python 3.8+, matplotlib, numpy and (for arrays) h5py.
"""

import os
import sys

# The package lives next to this script (reports/kvarn_report/); a package directory takes
# precedence over this same-named module on import.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kvarn_report import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
