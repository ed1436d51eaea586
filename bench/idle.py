"""The idle round trips alone, (2) and (6) of `bench.run`: plain Celery's `apply_async().get()`
against tffleet's `POST ?wait=` and POST then `GET ?wait=`, one client, nothing else queued,
measured in turns (three rounds each, medians), then the ratios.

    .venv/bin/python -m bench.idle [--jobs 200] [--database-url URL]

A minute instead of `bench.run`'s six: for comparing two commits (run it in a git worktree of
each, with PYTHONPATH=<worktree>), since this machine's speed drifts between runs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench import run
from tffleet.cli.process_group import ProcessGroup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="round trips per round")
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary directory")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # this process is the client
    with tempfile.TemporaryDirectory(prefix="tffleet-bench-") as tmp:
        work = Path(tmp)
        repository = work / "models"
        run.build_models(repository)
        group = ProcessGroup()
        celery: run.PlainCelery | None = None
        try:
            port = run.start_redis(group, tmp)
            threads = run.cpu_threads_per_child(1)
            celery = run.PlainCelery(repository, f"redis://127.0.0.1:{port}/1", threads=threads)
            database_url = args.database_url or f"sqlite:///{work / 'tffleet.db'}"
            fleet = run.start_fleet(
                group, repository, f"redis://127.0.0.1:{port}/0", database_url, "cpu:1"
            )
            r = run.idle_rounds(celery, fleet, jobs=args.jobs, rounds=3)
        finally:
            if celery is not None:
                celery.stop()
            group.stop()
    celery_ms = r["2idle"].p50_ms
    print(f"\n(2) plain Celery idle, .get()           p50 {celery_ms:6.2f} ms")
    print(f"(6) tffleet, POST ?wait= (one request)  p50 {r['6wait'].p50_ms:6.2f} ms")
    print(f"(6) tffleet, POST then GET ?wait=       p50 {r['6'].p50_ms:6.2f} ms")
    print(f"ratios (target <= 1): one request {r['6wait'].p50_ms / celery_ms:.2f}, "
          f"two requests {r['6'].p50_ms / celery_ms:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
