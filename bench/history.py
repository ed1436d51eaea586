"""What a job's history costs the claim: `db.jobs.claim_next` of a batch of 128 with the history
line appended (as it runs) and without (the claim before it), in turns, on PostgreSQL and on
SQLite, each in a scratch database of 20,000 queued one-sample jobs.

    .venv/bin/python -m bench.history [--database-url postgresql+psycopg://postgres@127.0.0.1/test]

Each claim runs in a transaction rolled back, so every round claims from the same queue.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

from bench.scratch import scratch_database
from db import jobs
from db.engine import make_engine, make_sessionmaker
from db.jobs import claims

JOBS, BATCH, ROUNDS = 20_000, 128, 40


def measure(url: str) -> tuple[float, float]:
    """Median claim time (ms) with the history line and without, measured in turns."""
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    for start in range(0, JOBS, 4000):
        with sessions.begin() as session:
            jobs.create(
                session=session,
                jobs=[
                    jobs.NewJob(model="m", version=1, samples=1, inputs=b"x")
                    for _ in range(start, min(start + 4000, JOBS))
                ],
            )
    took: dict[bool, list[float]] = {True: [], False: []}
    original = claims._claim_statement
    try:
        for _ in range(ROUNDS):
            for history in (True, False):
                claims._claim_statement = functools.partial(original, history=history)  # type: ignore[assignment]
                session = sessions()
                started = time.perf_counter()
                leases = jobs.claim_next(
                    session=session, model="m", version=1, owner="b", lease_s=30,
                    max_samples=BATCH,
                )  # fmt: skip
                took[history].append(time.perf_counter() - started)
                assert len(leases) == BATCH
                session.rollback()
                session.close()
    finally:
        claims._claim_statement = original  # type: ignore[assignment]
        engine.dispose()
    return statistics.median(took[True]) * 1000, statistics.median(took[False]) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql+psycopg://postgres@127.0.0.1/test")
    args = parser.parse_args(argv)
    print(f"claim_next of {BATCH} from {JOBS} queued jobs, median of {ROUNDS} each, in turns:")
    for label, url in (("PostgreSQL", args.database_url), ("SQLite", "sqlite://")):
        with scratch_database(url) as scratch:
            with_ms, without_ms = measure(scratch)
        print(
            f"  {label:10s} with history {with_ms:6.2f} ms, without {without_ms:6.2f} ms: "
            f"{with_ms / without_ms:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
