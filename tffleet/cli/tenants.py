"""`tffleet tenants list | set`: each tenant's quotas and weight, in the fleet's database.

A limit a tenant has no value of its own for is the fleet's default (TFFLEET_TENANT_*); `set`
changes only the limits it is given, and `default` puts one back to the fleet's default. The API
applies a change within 5 s. Exit status: 0 done; 1 the database failed; 2 a bad name or value.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from tffleet.cli.database import DatabaseError, fail, print_table, sessions

if TYPE_CHECKING:
    from db.tenants import Limits

_LIMITS = {
    "max_queued_jobs": "jobs it may have queued at once (429 `quota_exceeded` above; 0: no limit)",
    "max_samples_per_job": "samples in one job (422 above)",
    "max_priority": "the highest priority its jobs may ask for (422 above)",
    "max_ttl_s": "the longest retention `ttl_s` (a longer one is cut to it)",
    "weight": "its share of a model's batches while other tenants wait too (default 1)",
}


def _limit(text: str) -> int | None:
    if text == "default":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number or `default`, got {text!r}"
        ) from None


def add_tenant_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "tenants", help="list tenants and set their quotas (in the database)", description=__doc__
    )
    commands = parser.add_subparsers(dest="tenants_command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="every tenant with its limits in force")
    listing.set_defaults(func=cmd_list)

    change = commands.add_parser("set", help="set a tenant's own limits (created if new)")
    change.add_argument("name", metavar="TENANT", help="the tenant's name")
    for name, meaning in _LIMITS.items():
        change.add_argument(
            f"--{name.replace('_', '-')}",
            type=_limit,
            metavar="N",
            help=meaning,
            default=argparse.SUPPRESS,  # absent unless given: only the limits named change
        )
    change.set_defaults(func=cmd_set)


def cmd_list(args: argparse.Namespace) -> int:
    from db import tenants

    defaults = _defaults()
    try:
        with sessions() as made, made() as session:
            rows = [(t.name, defaults.over(t)) for t in tenants.list_tenants(session=session)]
    except DatabaseError as exc:
        return fail(str(exc))
    table = [("TENANT", "MAX QUEUED", "MAX SAMPLES/JOB", "MAX PRIORITY", "MAX TTL S", "WEIGHT")]
    for name, limits in rows:
        queued = str(limits.max_queued_jobs) if limits.max_queued_jobs else "no limit"
        table.append(
            (name, queued, str(limits.max_samples_per_job), str(limits.max_priority),
             str(limits.max_ttl_s), str(limits.weight))
        )  # fmt: skip
    print_table(table)
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    from db import tenants
    from tffleet.errors import InvalidRequest

    given = {name: getattr(args, name) for name in _LIMITS if hasattr(args, name)}
    if not given:
        print("tffleet: name at least one limit to set (see --help)", file=sys.stderr)
        return 2
    try:
        with sessions() as made, made.begin() as session:
            tenant = tenants.set_limits(session=session, name=args.name, **given)
            limits = _defaults().over(tenant)
    except InvalidRequest as exc:
        print(f"tffleet: {exc.message}", file=sys.stderr)
        return 2
    except DatabaseError as exc:
        return fail(str(exc))
    shown = ", ".join(f"{name} {getattr(limits, name)}" for name in _LIMITS)
    print(f"tffleet: tenant {args.name!r}: {shown}")
    return 0


def _defaults() -> Limits:
    from db.tenants import Limits
    from tffleet.settings import get_settings

    return Limits.defaults(get_settings())
