"""Registered model signatures, and migrations that match the models (both backends)."""

from __future__ import annotations

from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, func, inspect, select
from sqlalchemy.orm import Session, sessionmaker

from db import registry
from db.engine import make_engine
from db.migrate import alembic_config, upgrade
from db.models import Base, ModelVersion
from tffleet.errors import ModelNotFound, NotFound

Sessions = sessionmaker[Session]

INPUTS = {"x": {"dtype": "float32", "shape": [-1, 4]}}
OUTPUTS = {"y": {"dtype": "float32", "shape": [-1, 2]}}


def register(sessions: Sessions, name: str = "m", version: int = 1, **kwargs: Any) -> None:
    args: dict[str, Any] = {"format": "savedmodel", "inputs": INPUTS, "outputs": OUTPUTS}
    args.update(kwargs)
    with sessions.begin() as session:
        registry.register(session=session, name=name, version=version, **args)


def test_register_records_the_signature(sessions: Sessions) -> None:
    register(sessions, config={"max_batch_size": 8})
    with sessions() as session:
        found = registry.resolve(session=session, name="m", version=1)
    assert (found.name, found.version, found.format) == ("m", 1, "savedmodel")
    assert found.inputs == INPUTS and found.outputs == OUTPUTS
    assert found.config == {"max_batch_size": 8}
    assert found.registered_at.tzinfo is not None


def test_register_twice_updates_the_one_row(sessions: Sessions) -> None:
    register(sessions)
    with sessions() as session:
        first = registry.resolve(session=session, name="m", version=1).registered_at
    new_inputs = {"x": {"dtype": "float64", "shape": [-1, 8]}}
    register(sessions, format="keras", inputs=new_inputs, config={"k": 1})
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(ModelVersion)) == 1
        found = registry.resolve(session=session, name="m", version=1)
    assert (found.format, found.inputs, found.config) == ("keras", new_inputs, {"k": 1})
    assert found.registered_at >= first


def test_resolve_sees_a_re_registration_in_the_same_session(sessions: Sessions) -> None:
    with sessions.begin() as session:
        registry.register(
            session=session, name="m", version=1, format="a", inputs=INPUTS, outputs=OUTPUTS
        )
        first = registry.resolve(session=session, name="m")
        assert first.format == "a"
        registry.register(
            session=session, name="m", version=1, format="b", inputs=INPUTS, outputs=OUTPUTS
        )
        assert registry.resolve(session=session, name="m").format == "b"


def test_resolve_without_a_version_gives_the_latest(sessions: Sessions) -> None:
    for version in (1, 3, 2):
        register(sessions, version=version, format=f"v{version}")
    register(sessions, name="other", version=9)
    with sessions() as session:
        latest = registry.resolve(session=session, name="m")
        assert (latest.version, latest.format) == (3, "v3")
        assert registry.resolve(session=session, name="m", version=2).format == "v2"


def test_resolve_of_an_unknown_model_names_the_model(sessions: Sessions) -> None:
    register(sessions)
    with sessions() as session:
        for version in (None, 1):
            with pytest.raises(ModelNotFound, match=r"^model: .*'nope'") as caught:
                registry.resolve(session=session, name="nope", version=version)
            assert isinstance(caught.value, NotFound)
            assert caught.value.status_code == 404
            assert caught.value.message == "model: no model named 'nope' is registered; models: m"


def test_the_404_for_an_unknown_model_lists_the_first_ten_models_sorted(
    sessions: Sessions,
) -> None:
    with sessions() as session, pytest.raises(ModelNotFound, match=r"no model is registered yet$"):
        registry.resolve(session=session, name="nope")
    for n in (11, 3, 7, 1, 5, 9, 2, 10, 4, 8, 6, 12):  # registered out of order, two of them twice
        for version in (1, 2) if n in (3, 7) else (1,):
            register(sessions, name=f"m{n:02}", version=version)
    with sessions() as session, pytest.raises(ModelNotFound) as caught:
        registry.resolve(session=session, name="mnv2")
    listed = ", ".join(f"m{n:02}" for n in range(1, 11))
    assert caught.value.message == (
        f"model: no model named 'mnv2' is registered; models: {listed}, ..."
    )


def test_resolve_of_an_unknown_version_names_model_and_version(sessions: Sessions) -> None:
    register(sessions)
    with sessions() as session, pytest.raises(ModelNotFound, match=r"^version: .*'m'.* 7$"):
        registry.resolve(session=session, name="m", version=7)


def test_list_versions_orders_by_name_then_version(sessions: Sessions) -> None:
    for name, version in [("b", 2), ("a", 5), ("b", 1), ("a", 10)]:
        register(sessions, name=name, version=version)
    with sessions() as session:
        listed = [(m.name, m.version) for m in registry.list_versions(session=session)]
    assert listed == [("a", 5), ("a", 10), ("b", 1), ("b", 2)]


def test_migrations_match_the_models(engine: Engine) -> None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_migrations_downgrade_to_nothing_and_upgrade_again(sqlite_url: str) -> None:
    command.downgrade(alembic_config(sqlite_url), "base")
    engine = make_engine(sqlite_url)
    try:
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(sqlite_url)
        assert {"jobs", "model_versions"} <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
