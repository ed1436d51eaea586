"""The fleet's database for operator commands (`keys`, `models`): sessions, errors, tables."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker


class DatabaseError(Exception):
    """The database failed: reported as `tffleet: database error (...)`, exit status 1."""


@contextmanager
def sessions() -> Iterator[sessionmaker[Session]]:
    """Sessions on TFFLEET_DATABASE_URL; a database error raises DatabaseError with advice."""
    from sqlalchemy.exc import SQLAlchemyError

    from db.engine import make_engine, make_sessionmaker
    from tffleet.settings import get_settings

    url = get_settings().database_url
    missing = _missing_sqlite_file(url)
    if missing is not None:
        # Opening it would create an empty file there: a command run from another directory
        # than `tffleet up`'s (whose .tffleet/fleet.env names the fleet's) would leave one.
        raise DatabaseError(
            f"no database at {missing}; run this where `tffleet up` runs, or set "
            "TFFLEET_DATABASE_URL (and run `tffleet migrate` once for a new one)"
        )
    engine = make_engine(url)
    try:
        yield make_sessionmaker(engine)
    except SQLAlchemyError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseError(
            f"database error ({first}); is TFFLEET_DATABASE_URL right, and did "
            "`tffleet migrate` run?"
        ) from exc
    finally:
        engine.dispose()


def _missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite file `url` names that does not exist; None for any other URL."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    if path.startswith("file:") or Path(path).exists():
        return None
    return path


def print_table(rows: Sequence[Sequence[str]]) -> None:
    """Rows as columns padded to their widest cell; the first row is the header."""
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def fail(message: str) -> int:
    print(f"tffleet: {message}", file=sys.stderr)
    return 1
