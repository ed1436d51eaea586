"""One output of a job as an .npy: `GET /v1/jobs/{id}/outputs/{name}` (DESIGN §13).

An output too big to inline lives in the object store, a whole .npy under the job's prefix;
the job's JSON names it `{"uri": "tffleet://jobs/<id>/outputs/<name>", "dtype", "shape"}` and
this route streams it from the store chunk by chunk, never holding it whole. An output held in
the job's row is written as an .npy on the fly, so a client may fetch any output one way.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Path, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.downloads import download
from api.ids import JobId
from api.ingest import BLOB, Read
from api.schemas import ErrorOut, error_responses
from api.state import get_state
from db.models import JobStatus
from tffleet import tensors
from tffleet.errors import Conflict, InvalidInput, NotFound, OutputsGone
from tffleet.objectstore import ObjectStore

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

# Inline outputs up to this size are written as .npy on the event loop: a thread hop would
# cost more (as api/negotiation.py does for .npz answers).
_INLINE_NPY_BYTES = 64 * 1024

_NPY_ANSWER: dict[str, Any] = {
    "description": "The output as an .npy file (what `np.save` writes; `np.load` reads it).",
    "content": {tensors.NPY: {"schema": {"type": "string", "format": "binary"}}},
}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    **error_responses(404, 409, 410, 422, 503),
    200: _NPY_ANSWER,
    404: {"model": ErrorOut, "description": "Unknown job, or no output of that name."},
    409: {"model": ErrorOut, "description": "The job has not succeeded (yet)."},
    410: {"model": ErrorOut, "description": "The output's object is no longer in the store."},
    422: {"model": ErrorOut, "description": "A string output: no .npy holds it without pickle."},
    503: {"model": ErrorOut, "description": "Database or object store unreachable."},
}


@router.get("/{job_id}/outputs/{name}", response_class=Response, responses=_RESPONSES)
async def get_output(
    job_id: JobId,
    name: Annotated[str, Path(max_length=200)],
    request: Request,
) -> Response:
    """One output of a succeeded job as an .npy (`application/x-npy`, with Content-Length).

    An output the job's JSON gives by reference (`{"uri", "dtype", "shape"}`: too big to
    inline) is streamed from the object store; any other is written as an .npy on the fly.
    404 for an unknown job or output name, 409 for a job that has not succeeded, 410 once
    the output's object is gone from the store.
    """
    state = get_state(request)
    caller = await state.auth(request)
    (out,) = await state.reader(Read([job_id], BLOB, caller.scope))
    if out["status"] != JobStatus.SUCCEEDED.value:
        raise Conflict(f"job {job_id} is {out['status']}: only a succeeded job has outputs")
    blob = out["outputs"]
    if blob is None:  # a split job's parts joined, then its outputs dropped: nothing to read
        raise OutputsGone(f"job {job_id}: its outputs are no longer stored")
    reference = tensors.references(blob).get(name)
    if reference is not None:
        return await _streamed(state.objects, job_id, name, reference)
    inline = tensors.unpack(blob, inline_only=True)
    if name not in inline:
        shown = sorted({*inline, *tensors.references(blob)})
        raise NotFound(f"name: job {job_id} has no output {name!r}; its outputs are {shown}")
    return await _written(job_id, name, inline[name])


async def _streamed(
    store: ObjectStore, job_id: str, name: str, reference: tensors.Reference
) -> Response:
    """The output's object as it is (a whole .npy), streamed (api/downloads.py)."""
    return await download(
        store,
        reference.key,
        # The object is the whole .npy: its header, then the tensor's bytes (`offset` is where
        # they start), so this is its size without asking the store.
        size=reference.offset + reference.nbytes,
        media_type=tensors.NPY,
        filename=f"{name}.npy",
        gone=f"name: output {name!r} of job {job_id} is no longer in the object store",
    )


async def _written(job_id: str, name: str, array: np.ndarray) -> Response:
    if tensors.is_string(array):
        raise InvalidInput(
            f"name: output {name!r} of job {job_id} holds strings, which no .npy holds without "
            f"pickle; read it from GET /v1/jobs/{job_id}"
        )
    if array.nbytes <= _INLINE_NPY_BYTES:
        body = tensors.write_npy(array)
    else:
        body = await run_in_threadpool(tensors.write_npy, array)
    return Response(
        body,
        media_type=tensors.NPY,
        headers={"Content-Disposition": f'attachment; filename="{name}.npy"'},
    )
