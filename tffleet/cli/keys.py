"""`tffleet keys create | set | list | revoke`: API keys and their limits, in the fleet's database.

A key is shown once, when it is made, alone on the last line of `create`'s output (so
`KEY=$(tffleet keys create --tenant acme | tail -n 1)` works); the database keeps only its hash.

A key's limits (`create` or `set`; `none` takes one off): `--rate` jobs a second with `--burst`
at once (a second of the rate unless given), `--max-active-jobs` queued plus running (its
tenant's jobs, counted together: jobs do not record their key), `--models` it may use. Over the
rate or the cap the API answers 429 `rate_limited`; another model, 403 `model_not_allowed`. The
API applies a change within 5 s. Exit status: 0 done; 1 the database failed or no such key; 2 a
bad tenant name or limit.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from tffleet.cli.database import DatabaseError, fail, print_table, sessions

_NONE = "none"


def _rate(text: str) -> float | None:
    if text == _NONE:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected jobs a second above 0, or none; got {text!r}")
    return value


def _count(text: str) -> int | None:
    if text == _NONE:
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1, or none; got {text!r}")
    return int(text)


def _models(text: str) -> list[str] | None:
    if text == _NONE:
        return None
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected model names a,b or none; got {text!r}")
    return names


# The limits `create` and `set` take: their option, argument type, metavar and help.
_LIMITS: dict[str, tuple[str, Any, str, str]] = {
    "rate_per_s": (
        "--rate",
        _rate,
        "JOBS_PER_S",
        "jobs a second the key may submit (429 above); none: no rate",
    ),
    "rate_burst": (
        "--burst",
        _count,
        "N",
        "jobs it may submit at once over its rate (default: a second of it)",
    ),
    "max_active_jobs": (
        "--max-active-jobs",
        _count,
        "N",
        "its tenant's queued plus running jobs past which it is refused (429); none: no cap",
    ),
    "models": (
        "--models",
        _models,
        "A,B",
        "the only models it may use (403 for others); none: every one",
    ),
}


def _add_limits(parser: argparse.ArgumentParser) -> None:
    for name, (option, kind, metavar, meaning) in _LIMITS.items():
        parser.add_argument(
            option,
            dest=name,
            type=kind,
            metavar=metavar,
            help=meaning,
            default=argparse.SUPPRESS,  # absent unless given: only the limits named change
        )


def _given(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in _LIMITS if hasattr(args, name)}


def add_key_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser(
        "keys",
        help="make, limit, list and revoke API keys (in the database)",
        description=__doc__,
    )
    commands = keys.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")

    create = commands.add_parser(
        "create", help="make a key for a tenant (created if new); prints the key last, once"
    )
    create.add_argument("--tenant", required=True, help="the tenant whose jobs the key acts on")
    create.add_argument(
        "--admin", action="store_true", help="the key sees and manages every tenant's jobs"
    )
    create.add_argument("--note", help="what the key is for (shown by `keys list`)")
    _add_limits(create)
    create.set_defaults(func=cmd_create)

    change = commands.add_parser(
        "set", help="set a key's limits (rate, burst, cap on active jobs, models); none: off"
    )
    change.add_argument("prefix", metavar="PREFIX", help="the key's prefix (or the whole key)")
    _add_limits(change)
    change.set_defaults(func=cmd_set)

    listing = commands.add_parser("list", help="list keys (their prefixes, never the secrets)")
    listing.add_argument("--tenant", help="only this tenant's keys")
    listing.set_defaults(func=cmd_list)

    revoke = commands.add_parser("revoke", help="revoke a key; requests with it are then 401")
    revoke.add_argument("prefix", metavar="PREFIX", help="the key's prefix (or the whole key)")
    revoke.set_defaults(func=cmd_revoke)


def cmd_create(args: argparse.Namespace) -> int:
    from db import key_limits, tenants
    from tffleet.errors import InvalidRequest

    try:
        with sessions() as made, made.begin() as session:
            new = tenants.create_key(
                session=session, tenant=args.tenant, admin=args.admin, note=args.note
            )
            key_limits.set_key_limits(session=session, row=new.row, **_given(args))
            prefix, tenant, admin = new.row.prefix, new.row.tenant, new.row.admin
            limits = key_limits.KeyLimits.of(new.row)
    except InvalidRequest as exc:
        print(f"tffleet: {exc.message}", file=sys.stderr)
        return 2
    except DatabaseError as exc:
        return fail(str(exc))
    kind = "admin key (every tenant)" if admin else "key"
    print(
        f"tffleet: new {kind} {prefix} for tenant {tenant!r} ({limits.describe()}); "
        "it is shown once, here:"
    )
    print(new.key)
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    from db import key_limits, tenants
    from tffleet.errors import InvalidRequest, NotFound

    given = _given(args)
    if not given:
        options = ", ".join(option for option, *_ in _LIMITS.values())
        print(f"tffleet: name at least one limit to set ({options})", file=sys.stderr)
        return 2
    try:
        with sessions() as made, made.begin() as session:
            row = tenants.find_key(session=session, prefix=args.prefix)
            key_limits.set_key_limits(session=session, row=row, **given)
            prefix, tenant = row.prefix, row.tenant
            limits = key_limits.KeyLimits.of(row)
    except InvalidRequest as exc:
        print(f"tffleet: {exc.message}", file=sys.stderr)
        return 2
    except NotFound as exc:
        return fail(exc.message)
    except DatabaseError as exc:
        return fail(str(exc))
    print(
        f"tffleet: key {prefix} of tenant {tenant!r}: {limits.describe()} "
        "(the API applies it within 5 s)"
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from db import tenants
    from db.key_limits import KeyLimits

    try:
        with sessions() as made, made() as session:
            found = tenants.list_keys(session=session, tenant=args.tenant)
    except DatabaseError as exc:
        return fail(str(exc))
    rows = [
        (
            "PREFIX",
            "TENANT",
            "ADMIN",
            "CREATED",
            "REVOKED",
            "RATE/S",
            "BURST",
            "MAX ACTIVE",
            "MODELS",
            "NOTE",
        )
    ]
    for key in found:
        limits = KeyLimits.of(key)
        rate = limits.rate_per_s
        rows.append(
            (
                key.prefix,
                key.tenant,
                "yes" if key.admin else "no",
                f"{key.created_at:%Y-%m-%d %H:%M}",
                f"{key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "-",
                "none" if rate is None else f"{rate:g}",
                "none" if rate is None else str(limits.burst),
                "none" if limits.max_active_jobs is None else str(limits.max_active_jobs),
                "all" if limits.models is None else ",".join(sorted(limits.models)),
                key.note or "",
            )
        )
    print_table(rows)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    from db import tenants
    from tffleet.errors import NotFound

    try:
        with sessions() as made, made.begin() as session:
            key = tenants.revoke_key(session=session, prefix=args.prefix)
            prefix, tenant = key.prefix, key.tenant
    except NotFound as exc:
        return fail(exc.message)
    except DatabaseError as exc:
        return fail(str(exc))
    print(f"tffleet: revoked key {prefix} of tenant {tenant!r} (the API refuses it within 5 s)")
    return 0
