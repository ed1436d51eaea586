"""Claim time against queue depth on PostgreSQL: the claim's index by priority, highest first,
then deadline (`pick_deadline`), against those it replaced: without the deadline (the claim
then sorts a priority's jobs by deadline), and by ascending priority (side by side, one
database).

    .venv/bin/python -m bench.claim [--database-url postgresql+psycopg://postgres@127.0.0.1/test]

Stores 64,000 queued one-sample jobs of one model (priorities 0 to 6; with --deadlines F, a
fraction F of them with a `Cancel-After` of 1 to 2 hours) in a scratch database, then times
`db.jobs.claim_next` for a batch of 128 (each in a transaction rolled back), with each index in
turn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.scratch import scratch_database
from db import jobs
from db.engine import make_engine, make_sessionmaker

INDEXES = {
    "priority DESC, deadline (now)": "model, version, status, tenant, priority DESC, "
    "pick_deadline, id",
    "priority DESC (before)": "model, version, status, tenant, priority DESC, id",
    "priority ASC (before that)": "model, version, status, tenant, priority, id",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql+psycopg://postgres@127.0.0.1/test")
    parser.add_argument("--jobs", type=int, default=64_000)
    parser.add_argument("--deadlines", type=float, default=0.0, metavar="F")
    args = parser.parse_args(argv)
    with scratch_database(args.database_url) as url:
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        for start in range(0, args.jobs, 4000):
            with sessions.begin() as session:
                jobs.create(
                    session=session,
                    jobs=[
                        jobs.NewJob(
                            model="m",
                            version=1,
                            samples=1,
                            inputs=b"x",
                            priority=i % 7,
                            cancel_after_s=3600.0 + i % 3600
                            if (i * 0.618) % 1 < args.deadlines
                            else None,
                        )
                        for i in range(start, min(start + 4000, args.jobs))
                    ],
                )
        print(f"{args.jobs} queued jobs; claim_next of 128, median of 30:")
        for label, columns in INDEXES.items():
            with engine.begin() as conn:
                conn.exec_driver_sql("DROP INDEX ix_jobs_pick")
                conn.exec_driver_sql(f"CREATE INDEX ix_jobs_pick ON jobs ({columns})")
                conn.exec_driver_sql("ANALYZE jobs")
            took = []
            for _ in range(30):
                session = sessions()
                started = time.perf_counter()
                jobs.claim_next(
                    session=session, model="m", version=1, owner="b", lease_s=30, max_samples=128
                )
                took.append(time.perf_counter() - started)
                session.rollback()
                session.close()
            print(f"  {label:30s} {statistics.median(took) * 1000:7.2f} ms")
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
