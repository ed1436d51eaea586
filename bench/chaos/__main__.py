"""`python -m bench.chaos [--minutes N] [--seed S]`: see bench/chaos/__init__.py."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow builds the model here

from bench.chaos.run import chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10, help="of load and faults")
    parser.add_argument("--seed", type=int, default=None, help="replays a run (default: random)")
    parser.add_argument("--load-seed", type=int, default=None, help="the load's (default: --seed)")
    parser.add_argument("--logs", help="where the processes' logs go (default under /tmp)")
    parser.add_argument("--rate", type=float, default=15, help="submit requests a second")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    load = "" if args.load_seed is None else f", load seed {args.load_seed}"
    print(
        f"chaos: seed {seed}{load}, {args.minutes:g} minutes, {args.rate:g} requests/s", flush=True
    )
    started = time.monotonic()
    logs = Path(args.logs or f"/tmp/tffleet-chaos-logs-{seed}")
    with tempfile.TemporaryDirectory(prefix="tffleet-chaos-") as root:
        try:
            report = chaos(
                Path(root),
                duration_s=args.minutes * 60,
                seed=seed,
                load_seed=args.load_seed,
                rate=args.rate,
                out=lambda line: print(line, flush=True),
            )
        finally:  # every process's log, kept for a look at what the figures show
            shutil.copytree(Path(root) / "logs", logs, dirs_exist_ok=True)
            print(f"logs in {logs}")
    for line in report.lines:
        print(line)
    for failure in report.failures:
        print(f"FAILED: {failure}")
    verdict = "FAILED" if report.failures else "passed"
    print(f"chaos {verdict} (seed {seed}{load}, {time.monotonic() - started:.0f}s in all)")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
