"""The FastAPI application: wiring, lifespan, and the one exception handler."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import docs, openapi
from api.admission import Admission
from api.auth import Authenticator
from api.autoscaling import AutoscalingCollector
from api.hotpath import HotRoutes
from api.ingest import Ingestor, JobReader
from api.memory import freeze_startup, keep_freed_memory
from api.metrics import REQUESTS_REJECTED, exposition
from api.protocols.oip import routes as oip
from api.protocols.tfserving import routes as tfserving
from api.routes import (
    console,
    datasets,
    events,
    health,
    jobs,
    models,
    outputs,
    transform_events,
    transform_files,
    transforms,
    uploads,
    usage,
    webhooks,
)
from api.schemas import json_response
from api.state import AppState, SignatureCache
from api.storage import StorageCollector, database_source, object_store_sources
from api.waiter import CompletionWaiter
from db import secrets as fleet_secrets
from db.engine import WalCheckpointer, make_engine, make_sessionmaker, readonly
from tffleet import __version__
from tffleet.broker import PUBLISH_SOCKET_TIMEOUT_S, Publisher, make_celery
from tffleet.errors import InvalidInput, ServiceUnavailable, TffleetError
from tffleet.objectstore import open_store
from tffleet.settings import Settings, get_settings

log = logging.getLogger(__name__)


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    REQUESTS_REJECTED.labels(code=code).inc()
    response = json_response({"error": {"code": code, "message": message}}, status)
    response.headers.update(headers or {})
    return response


async def _on_tffleet_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, TffleetError)
    return _error(exc.status_code, exc.code, exc.message, exc.headers)


async def _on_request_validation(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    message = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
    return _error(422, InvalidInput.code, message)


async def _on_http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return _error(exc.status_code, "http_error", str(exc.detail))


async def _on_database_error(_: Request, exc: Exception) -> Response:
    if isinstance(exc, OperationalError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        log.warning("database unreachable: %s", exc)
        return _error(503, ServiceUnavailable.code, "database unreachable; try again")
    raise exc


def announcement_key(sessions: sessionmaker[Session]) -> Callable[[], bytes]:
    def read() -> bytes:
        with sessions() as session:
            return fleet_secrets.get(session=session, name=fleet_secrets.ANNOUNCEMENTS)

    return read


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        keep_freed_memory()  # large bodies without a page fault per page (api/memory.py)
        # Enough connections for every threadpool worker: an overflow connection is opened and
        # closed per use, which costs more than the query on SQLite.
        engine = make_engine(settings.database_url, pool_size=20, max_overflow=40)
        sessions = make_sessionmaker(engine)
        publisher = Publisher(make_celery(settings, socket_timeout_s=PUBLISH_SOCKET_TIMEOUT_S))
        reads = make_sessionmaker(readonly(engine))
        state = AppState(
            settings=settings,
            engine=engine,
            sessions=sessions,
            reads=reads,
            publisher=publisher,
            waiter=CompletionWaiter(settings.broker_url, key=announcement_key(sessions)),
            signatures=SignatureCache(sessions, poll_s=settings.model_poll_s),
            ingestor=Ingestor(sessions, publisher, reads=reads),
            reader=JobReader(reads),
            admission=Admission(reads, settings),
            auth=Authenticator(reads, enabled=settings.auth),
            # Opened here, not connected: an S3 store is reached at its first call (nothing to
            # close; a store down answers 503 where it is needed, not at start).
            objects=open_store(settings.object_store),
        )
        checkpointer = WalCheckpointer(engine)
        checkpointer.start()
        await state.waiter.start()
        await state.ingestor.start()
        await state.reader.start()
        app.state.tffleet = state
        # What /metrics serves (api/routes/health.py): the process metrics and, read at scrape
        # time, the autoscaling gauges and the storage ones.
        app.state.metrics = exposition(
            AutoscalingCollector(reads, poll_s=settings.model_poll_s),
            StorageCollector([database_source(reads), *object_store_sources(reads)]),
        )
        freeze_startup()  # the collector's full passes skip what startup made (api/memory.py)
        try:
            yield
        finally:
            await state.reader.stop()
            await state.ingestor.stop()
            await state.waiter.stop()
            await state.admission.close()
            checkpointer.stop()
            engine.dispose()

    app = FastAPI(
        title="tffleet",
        version=__version__,
        description="Asynchronous inference jobs on TensorFlow models.",
        lifespan=lifespan,
        docs_url=None,  # served by api/docs.py, without a CDN
        redoc_url=None,
    )
    docs.install(app)
    # The console's page, script and styles: files of the package, as they are (no CDN).
    app.mount("/console/assets", StaticFiles(directory=console.ASSETS), name="console-assets")
    app.include_router(console.router)
    app.include_router(jobs.router)
    app.include_router(outputs.router)
    app.include_router(uploads.router)
    app.include_router(datasets.router)
    app.include_router(transforms.router)
    app.include_router(transform_events.router)
    app.include_router(transform_files.router)
    app.include_router(events.router)
    app.include_router(models.router)
    app.include_router(usage.router)
    app.include_router(tfserving.router)
    app.include_router(oip.router)
    app.include_router(webhooks.router)
    app.include_router(health.router)
    app.add_exception_handler(TffleetError, _on_tffleet_error)
    app.add_exception_handler(RequestValidationError, _on_request_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(DBAPIError, _on_database_error)
    app.add_middleware(HotRoutes)  # POST /v1/jobs and GET /v1/jobs/{id}, past the router
    app.openapi = openapi.with_body_schemas(  # type: ignore[method-assign]
        app, auth=settings.auth, metrics_public=settings.metrics_public
    )
    return app
