"""`tffleet usage`: what the jobs that ended in a period cost, per tenant, model or day, read
from the fleet's database as `GET /v1/usage` sums it (db/usage.py): jobs, samples, device
seconds (each forward pass's time split among its jobs by samples), seconds queued and running.

Times are ISO 8601 (UTC unless they say), taken to the hour; the default period is the last 24
hours. `--csv` prints the same table as CSV. Exit status: 0 done; 1 the database failed; 2 a bad
time or period.
"""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import UTC, datetime, timedelta

from tffleet.cli.database import DatabaseError, fail, print_table, sessions

GROUPS = ("tenant", "model", "day")
COLUMNS = ("jobs", "samples", "device_s", "queue_s", "run_s")
DEFAULT_SPAN = timedelta(hours=24)


def _time(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time (2026-11-27 or 2026-11-27T14:00Z), got {text!r}"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def add_usage_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "usage",
        help="what the jobs that ended cost, per tenant, model or day (in the database)",
        description=__doc__,
    )
    parser.add_argument(
        "--from", dest="start", type=_time, metavar="TIME", help="default: --to less 24 hours"
    )
    parser.add_argument("--to", dest="end", type=_time, metavar="TIME", help="default: now")
    parser.add_argument(
        "--group-by", choices=GROUPS, default="tenant", help="one row per (default: tenant)"
    )
    parser.add_argument("--tenant", metavar="NAME", help="only this tenant's jobs")
    parser.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    parser.set_defaults(func=cmd_usage)


def cmd_usage(args: argparse.Namespace) -> int:
    from db import usage

    end: datetime = args.end or datetime.now(UTC)
    start: datetime = args.start or end - DEFAULT_SPAN
    if end <= start:
        print("tffleet: --to: must be after --from", file=sys.stderr)
        return 2
    try:
        with sessions() as made, made() as session:
            groups = usage.summarize(
                session=session,
                start=start,
                end=end,
                group_by=usage.GroupBy(args.group_by),
                tenant=args.tenant,
            )
    except DatabaseError as exc:
        return fail(str(exc))
    rows = [(str(g[args.group_by]), *(_cell(name, g[name]) for name in COLUMNS)) for g in groups]
    if args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow((args.group_by, *COLUMNS))
        writer.writerows(rows)
        return 0
    if not rows:
        print(f"tffleet: no job ended from {start:%Y-%m-%d %H:00} to {end:%Y-%m-%d %H:%M} UTC")
        return 0
    total = usage.total(groups)
    header = (args.group_by.upper(), *(name.upper() for name in COLUMNS))
    print_table([header, *rows, ("TOTAL", *(_cell(n, total[n]) for n in COLUMNS))])
    return 0


def _cell(name: str, value: float) -> str:
    return str(int(value)) if name in ("jobs", "samples") else f"{value:.3f}"
