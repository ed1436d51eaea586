"""Secrets the fleet's processes share through the database: the API and the workers reach it,
nobody else does (docs/explanation/security-model.md). Made on first use; a migration makes the
first ones."""

from __future__ import annotations

import secrets

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db.models import FleetSecret

# Signs what workers announce on the completion channel (tffleet.announcements).
ANNOUNCEMENTS = "announcements"


def get(*, session: Session, name: str) -> bytes:
    """The secret named `name`, made now (256 random bits) if the database has none yet; two
    processes racing to make it both end with the one that was stored first."""
    found = session.get(FleetSecret, name)
    if found is None:
        insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
        session.execute(
            insert(FleetSecret)
            .values(name=name, value=secrets.token_hex(32))
            .on_conflict_do_nothing(index_elements=[FleetSecret.name])
        )
        session.commit()
        found = session.get(FleetSecret, name, populate_existing=True)
        assert found is not None
    return found.value.encode()
