"""`tffleet keys create | list | revoke`: API keys, straight in the fleet's database.

A key is shown once, when it is made, alone on the last line of `create`'s output (so
`KEY=$(tffleet keys create --tenant acme | tail -n 1)` works); the database keeps only its hash.
Exit status: 0 done; 1 the database failed or no such key; 2 a bad tenant name.
"""

from __future__ import annotations

import argparse
import sys

from tffleet.cli.database import DatabaseError, fail, print_table, sessions


def add_key_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser(
        "keys", help="make, list and revoke API keys (in the database)", description=__doc__
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
    create.set_defaults(func=cmd_create)

    listing = commands.add_parser("list", help="list keys (their prefixes, never the secrets)")
    listing.add_argument("--tenant", help="only this tenant's keys")
    listing.set_defaults(func=cmd_list)

    revoke = commands.add_parser("revoke", help="revoke a key; requests with it are then 401")
    revoke.add_argument("prefix", metavar="PREFIX", help="the key's prefix (or the whole key)")
    revoke.set_defaults(func=cmd_revoke)


def cmd_create(args: argparse.Namespace) -> int:
    from db import tenants
    from tffleet.errors import InvalidRequest

    try:
        with sessions() as made, made.begin() as session:
            new = tenants.create_key(
                session=session, tenant=args.tenant, admin=args.admin, note=args.note
            )
            prefix, tenant, admin = new.row.prefix, new.row.tenant, new.row.admin
    except InvalidRequest as exc:
        print(f"tffleet: {exc.message}", file=sys.stderr)
        return 2
    except DatabaseError as exc:
        return fail(str(exc))
    kind = "admin key (every tenant)" if admin else "key"
    print(f"tffleet: new {kind} {prefix} for tenant {tenant!r}; it is shown once, here:")
    print(new.key)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from db import tenants

    try:
        with sessions() as made, made() as session:
            found = tenants.list_keys(session=session, tenant=args.tenant)
    except DatabaseError as exc:
        return fail(str(exc))
    rows = [("PREFIX", "TENANT", "ADMIN", "CREATED", "REVOKED", "NOTE")]
    for key in found:
        rows.append(
            (
                key.prefix,
                key.tenant,
                "yes" if key.admin else "no",
                f"{key.created_at:%Y-%m-%d %H:%M}",
                f"{key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "-",
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
