"""The `tffleet` command line, one file per command group (see `tffleet.cli.main`)."""

from tffleet.cli.main import main

__all__ = ["main"]
