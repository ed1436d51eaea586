"""A transform's output files through the API: `GET /v1/transforms/{id}/files[/{name}]`.

A transform writes its parts where its output URI says (DESIGN §14): the fleet's own store under
`tffleet://transforms/<id>/` by default, or a `file://` or `s3://` prefix the operator allows. A
client has no access to the first at all, and need not have to the others: these routes list
what the transform wrote there (its parts `part-<shard>.<ext>`, and `errors/part-<shard>.jsonl`
for shards with bad records; nothing else that lies beside them, such as the staging file that
a worker killed mid-write leaves in a `file://` output, `part-00000.parquet#1`) and stream one
file from the store chunk by chunk, never holding it whole, as the outputs route streams a
job's output.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select

from api.downloads import download
from api.ids import JobId
from api.schemas import error_responses, json_response
from api.state import AppState, get_state
from db.models import Transform
from db.tenants import Caller
from tffleet.datasets.locations import Location, LocationRefused, resolve
from tffleet.errors import NotFound

router = APIRouter(prefix="/v1/transforms", tags=["transforms"])

# What a transform writes under its output URI, and nothing else found there.
_FILE = re.compile(r"(errors/)?part-(\d{5,})\.(parquet|jsonl|npy)")
_MEDIA = {
    "parquet": "application/vnd.apache.parquet",
    "jsonl": "application/jsonl",
    "npy": "application/x-npy",
}

_LIST_ANSWER: dict[str, Any] = {
    "description": "The files the transform wrote so far, by name, parts first.",
    "content": {
        "application/json": {
            "example": {
                "output_uri": "tffleet://transforms/0190c2d4-.../",
                "files": [{"name": "part-00000.parquet", "kind": "part"}],
            }
        }
    },
}
_FILE_ANSWER: dict[str, Any] = {
    "description": "The file's bytes as the transform wrote them.",
    "content": {
        media: {"schema": {"type": "string", "format": "binary"}} for media in _MEDIA.values()
    },
}


@router.get("/{transform_id}/files", responses={**error_responses(404, 503), 200: _LIST_ANSWER})
async def list_files(transform_id: JobId, request: Request) -> Response:
    """The files a transform wrote under its output URI so far: its parts
    (`part-<shard>.<ext>`, kind `part`) and the errors files of shards that had bad records
    (`errors/part-<shard>.jsonl`, kind `errors`, JSON Lines of `{"index", "key", "reason"}`),
    in shard order. 404 for an unknown transform."""
    state = get_state(request)
    caller = await state.auth(request)
    row = await run_in_threadpool(_transform, state, caller, transform_id)
    found = await run_in_threadpool(_listed, state, row)
    return json_response({"output_uri": row.output_uri, "files": found}, 200)


@router.get(
    "/{transform_id}/files/{name:path}",
    response_class=Response,
    responses={**error_responses(404, 410, 503), 200: _FILE_ANSWER},
)
async def get_file(
    transform_id: JobId,
    name: Annotated[str, Path(max_length=200, description="part-00000.parquet, errors/...")],
    request: Request,
) -> Response:
    """One file the transform wrote (a name `GET /v1/transforms/{id}/files` lists), streamed
    from where it lies, with Content-Length. 404 for an unknown transform, or a name that is
    no file of a transform or is not written (yet); 410 once it is gone from the store."""
    state = get_state(request)
    caller = await state.auth(request)
    row = await run_in_threadpool(_transform, state, caller, transform_id)
    match = _FILE.fullmatch(name)
    if match is None:
        raise NotFound(f"name: {name!r} is no file of a transform (part-00000.parquet, errors/...)")
    location = _location(state, row, name)
    size = await location.store.size_async(location.key)
    if size is None:
        raise NotFound(f"name: transform {transform_id} has no file {name!r} (yet)")
    return await download(
        location.store,
        location.key,
        size=size,
        media_type=_MEDIA[match.group(3)],
        filename=name.rsplit("/", 1)[-1],
        gone=f"name: {name!r} of transform {transform_id} is gone",
    )


def _transform(state: AppState, caller: Caller, transform_id: str) -> Transform:
    """The transform, if the caller may see it (its tenant's, or any for an admin); else 404."""
    query = select(Transform).where(Transform.id == transform_id)
    if caller.scope is not None:
        query = query.where(Transform.tenant == caller.scope)
    with state.sessions() as session:
        row = session.scalars(query).one_or_none()
        if row is None:
            raise NotFound(f"transform {transform_id} not found")
        session.expunge(row)
    return row


def _location(state: AppState, row: Transform, name: str) -> Location:
    """Where a file under the transform's output lies: resolved for the transform's tenant (an
    admin reading another tenant's transform reads that tenant's store)."""
    uri = row.output_uri if row.output_uri.endswith("/") else f"{row.output_uri}/"
    try:
        return resolve(uri + name, row.tenant, state.settings)
    except LocationRefused as exc:  # the fleet's locations changed since it was created
        raise NotFound(f"name: {exc}") from None


def _listed(state: AppState, row: Transform) -> list[dict[str, Any]]:
    """One listing of the output's folder (`resolve` keeps its trailing `/`), what a transform
    of this one's shards and format would write there kept: a part of another's is not."""
    prefix = _location(state, row, "")
    wrote = (row.spec.get("output") or {}).get("format")
    files: list[tuple[bool, int, str]] = []
    for key in prefix.store.keys(prefix.key):
        name = key[len(prefix.key) :]
        match = _FILE.fullmatch(name)
        if match is None or int(match.group(2)) >= row.shards_total:
            continue
        errors = match.group(1) is not None
        if match.group(3) != ("jsonl" if errors else wrote):
            continue
        files.append((errors, int(match.group(2)), name))
    return [
        {"name": name, "kind": "errors" if errors else "part"} for errors, _, name in sorted(files)
    ]
