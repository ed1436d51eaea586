"""The `tffleet` command: parse, join a fleet `tffleet up` runs here, dispatch to a command group.

Each group is a file of this package: `up` (the whole fleet on one machine), `services` (api,
worker, sweeper, flower, migrate), `jobs` (submit, status, retry, delete), `models` (register,
list, reload), `keys` (create, list, revoke), `tenants` (list, set), `transform` (transform,
transforms, datasets), `usage`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tffleet import __version__
from tffleet.cli.jobs import add_job_commands
from tffleet.cli.keys import add_key_commands
from tffleet.cli.models import add_model_commands
from tffleet.cli.services import add_service_commands
from tffleet.cli.tenants import add_tenant_commands
from tffleet.cli.transform import add_transform_commands
from tffleet.cli.up import add_up_command
from tffleet.cli.usage import add_usage_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tffleet", description="Asynchronous inference jobs on TensorFlow models."
    )
    parser.add_argument("--version", action="version", version=f"tffleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_up_command(sub)
    add_service_commands(sub)  # api, worker, sweeper, migrate, flower
    add_job_commands(sub)  # submit, status, retry, delete
    add_model_commands(sub)  # models register, list, reload
    add_key_commands(sub)  # keys create, list, revoke
    add_tenant_commands(sub)  # tenants list, set
    add_transform_commands(sub)  # transform; transforms status, list, ...; datasets put
    add_usage_command(sub)  # usage
    return parser


def _join_running_fleet(command: str) -> None:
    """Use the settings of a `tffleet up` running from this directory, unless set otherwise."""
    from tffleet.fleet_env import DEFAULT_DATA_DIR, FLEET_ENV, running_fleet_env

    found = {k: v for k, v in running_fleet_env().items() if k not in os.environ}
    if found:
        os.environ.update(found)
        print(
            f"tffleet {command}: using the fleet of `tffleet up` ({DEFAULT_DATA_DIR / FLEET_ENV})",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["up"]:  # before parsing: the parser's defaults read the environment
        _join_running_fleet(argv[0] if argv else "")
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Alembic 1.16+ logs each plugin it sets up at import: noise on every start.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # settings that do not parse
        print(f"tffleet: {exc}", file=sys.stderr)
        return 2
