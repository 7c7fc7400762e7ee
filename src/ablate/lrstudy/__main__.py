"""``python -m ablate.lrstudy``."""

import logging
import sys

from ablate.lrstudy.cli import main

# the study's own lines (each trial's lr, a widening), as a job's: trials log through Hydra
logging.basicConfig(format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
logging.getLogger("ablate").setLevel(logging.INFO)
sys.exit(main())
