"""How long ``python -m ablate.train`` takes to answer ``--help`` and a configuration error, and
to import the training stack (median of ``--repeats`` fresh processes each). A benchmark, not a
test: timings depend on the machine and its load, which it prints.

    python benchmarks/startup.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from ablate.tables import markdown_table

CASES = {
    "--help": ["-m", "ablate.train", "--help"],
    "a misspelt key": ["-m", "ablate.train", "trainer.lrr=1"],
    "an unknown option": ["-m", "ablate.train", "freeze=nope"],
    "import the training stack": ["-c", "import ablate.training.fit, ablate.tracking.run"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; median of {args.repeats}")
    rows = []
    for name, argv in CASES.items():
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, *argv], env=env, capture_output=True)
            times.append(time.perf_counter() - t0)
        rows.append((name, f"{statistics.median(times):.2f}"))
    print(markdown_table(rows, ["command", "seconds"], right=["seconds"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
