"""``python -m ablate.report``."""

import sys

from ablate.report.cli import main

sys.exit(main())
