"""What the webhook outbox costs a job's transactions: submit (create), claim and complete, per
job and per batch of 128, on SQLite and PostgreSQL.

    .venv/bin/python -m bench.webhooks [--webhooks] [--database-url URL ...]

Without `--webhooks` no job has one: run it here and at a commit from before webhooks (a git
worktree, `PYTHONPATH=<worktree>`) for the before/after of a fleet that uses none. With
`--webhooks` every job asks for `start` and `completed`: what the outbox costs when it is used.
Each figure is the median of many rounds, in milliseconds per transaction.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.scratch import scratch_database
from db import jobs
from db.engine import make_engine, make_sessionmaker

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def new_jobs(count: int, hooked: bool) -> list[jobs.NewJob]:
    extra: dict[str, Any] = (
        {"webhook": "https://93.184.216.34/hook", "webhook_events": 3} if hooked else {}
    )
    return [
        jobs.NewJob(model="m", version=1, samples=1, inputs=b"x" * 64, **extra)
        for _ in range(count)
    ]


def measure(url: str, *, batch: int, rounds: int, hooked: bool) -> dict[str, float]:
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    times: dict[str, list[float]] = {"create": [], "claim": [], "complete": []}

    def timed(name: str, step: Callable[[Any], Any]) -> Any:
        started = time.perf_counter()
        with sessions.begin() as session:
            result = step(session)
        times[name].append(time.perf_counter() - started)
        return result

    for _ in range(rounds):
        timed("create", lambda s: jobs.create(session=s, jobs=new_jobs(batch, hooked)))
        leases = timed(
            "claim",
            lambda s: jobs.claim_next(
                session=s, model="m", version=1, owner="bench", lease_s=60, max_samples=batch
            ),
        )
        results = [(lease, b"y") for lease in leases]
        timed("complete", lambda s, done=results: jobs.complete(session=s, results=done))
    engine.dispose()
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--webhooks", action="store_true", help="every job has a webhook")
    parser.add_argument("--postgres-url", default=POSTGRES)
    args = parser.parse_args()
    for backend, server in (("sqlite", "sqlite://"), ("postgresql", args.postgres_url)):
        with scratch_database(server) as url:
            for batch, rounds in ((1, 400), (128, 60)):
                measure(url, batch=batch, rounds=20, hooked=args.webhooks)  # warm up
                ms = measure(url, batch=batch, rounds=rounds, hooked=args.webhooks)
                shown = ", ".join(f"{name} {value:.3f} ms" for name, value in ms.items())
                print(f"{backend:10} batch {batch:3}: {shown}", flush=True)


if __name__ == "__main__":
    main()
