"""What the console's overview costs the API on a busy fleet's database (PostgreSQL): one read
with nothing cached (every minute of the charts scanned) and the steady read a polling console
makes (the settled minutes kept, the last two scanned), beside one `POST /v1/jobs`-sized
insert of a job for scale.

    .venv/bin/python -m bench.console [--database-url postgresql+psycopg://postgres@127.0.0.1/test]
        [--ended 200000] [--queued 20000]

`--ended` jobs ended over the last 15 minutes (about 220 a second), `--queued` wait in the queue.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Any

from sqlalchemy import text

from api.routes.console import _Cache, _read_overview
from bench.scratch import scratch_database
from db import jobs, tenants
from db.engine import make_engine, make_sessionmaker
from tffleet.settings import Settings

ROUNDS = 15


def _fill(sessions: Any, ended: int, queued: int) -> None:
    with sessions.begin() as session:
        for i in range(7):
            tenants.ensure_tenant(session=session, name=f"t{i}")
    for start in range(0, ended + queued, 5000):
        with sessions.begin() as session:
            jobs.create(
                session=session,
                jobs=[
                    jobs.NewJob(model="m", version=1, samples=1, inputs=b"x", tenant=f"t{i % 7}")
                    for i in range(start, min(start + 5000, ended + queued))
                ],
            )
    with sessions.begin() as session:
        session.execute(
            text(
                "UPDATE jobs SET status = 'succeeded', "
                "finished_at = now() AT TIME ZONE 'UTC' - random() * interval '15 minutes' "
                "WHERE id IN (SELECT id FROM jobs ORDER BY id LIMIT :n)"
            ),
            {"n": ended},
        )
        session.execute(text("UPDATE jobs SET created_at = finished_at - interval '40 ms' "
                             "WHERE finished_at IS NOT NULL"))  # fmt: skip
        session.execute(text("ANALYZE jobs"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql+psycopg://postgres@127.0.0.1/test")
    parser.add_argument("--ended", type=int, default=200_000)
    parser.add_argument("--queued", type=int, default=20_000)
    args = parser.parse_args(argv)
    with scratch_database(args.database_url) as url:
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        _fill(sessions, args.ended, args.queued)
        state = SimpleNamespace(
            settings=Settings(database_url=url), reads=sessions, sessions=sessions
        )
        cold, warm = [], []
        for _ in range(ROUNDS):
            cache = _Cache()
            started = time.perf_counter()
            _read_overview(state, cache)  # type: ignore[arg-type]
            cold.append(time.perf_counter() - started)
            started = time.perf_counter()
            _read_overview(state, cache)  # type: ignore[arg-type]
            warm.append(time.perf_counter() - started)
        insert = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            with sessions.begin() as session:
                jobs.create(
                    session=session,
                    jobs=[jobs.NewJob(model="m", version=1, samples=1, inputs=b"x" * 4096)],
                )
            insert.append(time.perf_counter() - started)
        engine.dispose()
    cold_ms, warm_ms = statistics.median(cold) * 1000, statistics.median(warm) * 1000
    insert_ms = statistics.median(insert) * 1000
    print(
        f"{args.ended} jobs ended in the last 15 minutes, {args.queued} queued; medians of "
        f"{ROUNDS}:\n"
        f"  overview, nothing cached      {cold_ms:7.1f} ms\n"
        f"  overview, as a console polls  {warm_ms:7.1f} ms  (at most once a second per API "
        f"process, however many consoles poll)\n"
        f"  one job stored, for scale     {insert_ms:7.1f} ms  "
        f"(the polled overview = {warm_ms / insert_ms:.0f} submissions)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
