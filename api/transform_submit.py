"""A transform checked before anything is stored (DESIGN §14): its model resolved, its input and
output locations allowed, each input file inspected (its records and columns, reading as little
as its format allows) and its columns checked against the model's signature. Every refusal is a
422 naming the field (`input.uri`, `input.columns.<input>`, `output.uri`, `shard_records`, ...),
a store that does not answer a 503; only then is the transform cut into shards and stored.

The file I/O runs in a thread (`prepare`), files inspected a few at once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api.state import AppState
from api.transform_schemas import TransformCreate
from db.ids import new_job_id
from db.tenants import Caller, Limits
from db.transform_control import NewTransform
from db.transform_views import errors_uri
from db.webhooks import Event
from tffleet import webhooks
from tffleet.datasets import formats, locations, mapping
from tffleet.datasets.base import FileInfo
from tffleet.datasets.locations import Location
from tffleet.errors import InvalidInput
from tffleet.objectstore.store import ObjectMissing

# Files inspected at once: each is a few small reads (Parquet's footer) or a scan (CSV).
INSPECT_THREADS = 8
# Records per forward pass when neither the request nor the model's config says.
DEFAULT_BATCH_RECORDS = 128


def prepare(state: AppState, caller: Caller, limits: Limits, spec: TransformCreate) -> NewTransform:
    """The transform to store, or InvalidInput naming what does not fit. Blocking I/O: run it
    in a thread."""
    settings = state.settings
    signature = state.signatures.resolve(spec.model, spec.version)  # 404 for no such model
    priority, shard_records = _limits(spec, limits, settings.transform_priority)
    shard_records = shard_records or min(
        settings.transform_shard_records, limits.max_samples_per_job
    )
    if spec.webhook is not None:
        try:
            webhooks.check(spec.webhook, allow_private=settings.webhook_allow_private)
        except webhooks.WebhookAddressError as exc:
            raise InvalidInput(f"webhook: {exc}") from None
    transform_id = new_job_id()
    output_uri = spec.output.uri or f"tffleet://transforms/{transform_id}/"
    output_uri = output_uri.rstrip("/") + "/"
    try:
        locations.resolve(output_uri, caller.tenant, settings, write=True)
    except locations.LocationRefused as exc:
        raise InvalidInput(f"output.uri: {exc}") from None
    files = _input_files(spec, caller.tenant, state)
    infos = _inspect(files)
    _check_columns(spec, signature["inputs"], files, infos)
    config = signature.get("config") or {}
    return NewTransform(
        id=transform_id,
        tenant=caller.tenant,
        model=signature["name"],
        version=signature["version"],
        priority=priority,
        spec={
            "input": spec.input.model_dump(),
            "output": {"uri": output_uri, "format": spec.output.format},
            "shard_records": shard_records,
        },
        files=[
            {"uri": file.uri, "format": format, "info": info.to_json()}
            for (file, format), info in zip(files, infos, strict=True)
        ],
        output_uri=output_uri,
        errors_uri=errors_uri(output_uri),
        shard_records=shard_records,
        batch_records=spec.batch_records
        or int(config.get("max_batch_size") or DEFAULT_BATCH_RECORDS),
        webhook=spec.webhook,
        webhook_events=None if spec.webhook is None else int(Event.COMPLETED),
    )


def _limits(spec: TransformCreate, limits: Limits, default_priority: int) -> tuple[int, int | None]:
    """Its priority (the fleet's default, capped to the tenant's highest) and the shard size it
    asked for, both within the tenant's limits (422 naming the field otherwise)."""
    if spec.priority is not None and spec.priority > limits.max_priority:
        raise InvalidInput(
            f"priority: at most {limits.max_priority} for this tenant, got {spec.priority}"
        )
    priority = spec.priority if spec.priority is not None else default_priority
    if spec.shard_records is not None and spec.shard_records > limits.max_samples_per_job:
        raise InvalidInput(
            f"shard_records: at most {limits.max_samples_per_job} (this tenant's samples per "
            f"job), got {spec.shard_records}"
        )
    return min(priority, limits.max_priority), spec.shard_records


def _input_files(spec: TransformCreate, tenant: str, state: AppState) -> list[tuple[Location, str]]:
    """The input's files (a prefix expanded, sorted) with each one's format."""
    try:
        found = locations.expand(spec.input.uri, tenant, state.settings)
    except locations.LocationRefused as exc:
        raise InvalidInput(f"input.uri: {exc}") from None
    files = []
    for file in found:
        format = spec.input.format or formats.format_of(file.uri)
        if format is None:
            raise InvalidInput(
                f"input.format: {file.uri}: its name says no format; name one of "
                f"{', '.join(formats.INPUT_FORMATS)}"
            )
        files.append((file, format))
    return files


def _inspect(files: list[tuple[Location, str]]) -> list[FileInfo]:
    """Each file's records and columns, a few files at once; 422 naming the file that cannot
    be read as its format, 503 (StoreUnavailable) when the store does not answer."""

    def one(item: tuple[Location, str]) -> FileInfo:
        file, format = item
        try:
            return formats.inspect(file, format)
        except ObjectMissing:
            raise InvalidInput(f"input.uri: {file.uri}: no such file") from None
        except ValueError as exc:  # DatasetError: not a file of its format
            raise InvalidInput(f"input.uri: {file.uri}: not a {format} file: {exc}") from None

    if len(files) == 1:
        return [one(files[0])]
    with ThreadPoolExecutor(INSPECT_THREADS, thread_name_prefix="inspect") as pool:
        return list(pool.map(one, files))


def _check_columns(
    spec: TransformCreate,
    signature: dict[str, Any],
    files: list[tuple[Location, str]],
    infos: list[FileInfo],
) -> None:
    """Every file's columns against the model's inputs (the first file's problems, naming it)."""
    for (file, _), info in zip(files, infos, strict=True):
        errors = mapping.check(info.schema, signature, spec.input.columns, key=spec.input.key)
        if errors:
            where = f" (in {file.uri})" if len(files) > 1 else ""
            raise InvalidInput("; ".join(f"input.{error}" for error in errors) + where)
