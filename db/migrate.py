"""Alembic, configured in code so `tffleet migrate` needs no alembic.ini on disk."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from db.engine import normalize_url

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Alembic's config is an .ini parser: a literal % in a password must be doubled.
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)
