"""Content negotiation for the job API: what a submission's body is (JSON, or one job as a
binary .npz or .npy body with the rest of it in the query), and how a job is answered (JSON,
outputs as JSON lists or `b64`, or as an .npz of its outputs where `Accept` asks for one).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from fastapi import Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from api.npz_answer import npz_body, stored_bytes
from api.schemas import JobCreate, json_response
from api.submission import parse
from db.views import outputs_out
from tffleet import tensors
from tffleet.errors import InvalidInput, OutputsGone
from tffleet.objectstore import ObjectStore, StoreUnavailable

log = logging.getLogger(__name__)

# How outputs are written in a JSON answer: nested lists, or binary envelopes.
Encoding = Literal["json", "b64"]

# Binary bodies (one job): what each holds, and the query parameters that say the rest.
BINARY = (tensors.NPZ, tensors.NPY)
ACCEPTED = ("application/json", *BINARY)
_QUERY_FIELDS = ("model", "version", "priority", "ttl_s", "webhook", "webhook_events")
_QUERY_NAMES = tuple(name.encode() for name in _QUERY_FIELDS)


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def is_json(media: str) -> bool:
    # As api.body reads it: application/json, or any application/...+json.
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def accepts_npz(request: Request) -> bool:
    """Whether the Accept header lists application/x-npz (and not with q=0)."""
    accept = request.headers.get("accept", "").lower()
    if tensors.NPZ not in accept:
        return False
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media == tensors.NPZ:
            for param in params:
                name, _, value = param.partition("=")
                if name.strip() == "q":
                    try:
                        return float(value) > 0
                    except ValueError:
                        return False
            return True
    return False


def no_binary_parameters(request: Request) -> None:
    """422 naming the first query parameter that only a binary body may come with."""
    raw: bytes = request.scope.get("query_string", b"")
    if b"%" not in raw and not any(name in raw for name in _QUERY_NAMES):
        return  # none, seen without parsing the query (3% of a JSON submit's CPU)
    given = [name for name in _QUERY_FIELDS if name in request.query_params]
    if given:
        raise InvalidInput(
            f"{given[0]}: a query parameter only with a binary body ({', '.join(BINARY)}); "
            "a JSON body gives it in the body"
        )


def binary_spec(request: Request) -> JobCreate:
    """The job a binary body comes with, from the query parameters, checked as a JSON body's
    fields are (with the same messages); its inputs are read from the body later."""
    query = request.query_params
    fields: dict[str, Any] = {name: query[name] for name in _QUERY_FIELDS if name in query}
    if "webhook_events" in query:
        fields["webhook_events"] = [
            event.strip()
            for given in query.getlist("webhook_events")
            for event in given.split(",")
            if event.strip()
        ]
    return parse(JobCreate, {**fields, "inputs": {}})


# Outputs up to this size are written into an .npz on the event loop: a thread hop would cost
# more.
_INLINE_NPZ_BYTES = 64 * 1024


async def answer(
    out: dict[str, Any],
    *,
    encoding: Encoding,
    status_code: int = 200,
    store: ObjectStore | None = None,
    max_stored_bytes: int = 0,
    stored_errors: bool = True,
) -> Response:
    """A job as JSON, or, where it was read with its outputs as their stored blob (`BLOB`), as
    an .npz of them with the job in the `Tffleet-Job` header (JSON, outputs null).

    Outputs held in the object store (too big to inline, DESIGN §13) are read from `store` into
    the .npz, streamed (api/npz_answer.py), as long as their objects take at most
    `max_stored_bytes` together: the routes give TFFLEET_MAX_BODY_BYTES, the most one request
    may carry in, so an answer carries out at most as much, and reads from the store only what
    it sends. Past that (or without a store) the job is answered as JSON, each such output a
    reference (`db.views.outputs_out`) that `GET /v1/jobs/{id}/outputs/{name}` streams. An
    object gone from the store is a 410 `outputs_gone`, a store that does not answer a 503, as
    that route answers them; with `stored_errors` false (an answer to a submission: its job is
    stored, and an error would have a client that retries without a key store it twice) the
    job is answered as JSON instead. The answer's Content-Type says which it is, as for string
    outputs."""
    blob = out["outputs"]
    if not isinstance(blob, bytes):
        return json_response(out, status_code)
    references = tensors.references(blob)
    if references:
        if store is not None and stored_bytes(references) <= max_stored_bytes:
            response = await _stored_npz(out, store, blob, status_code, stored_errors)
            if response is not None:
                return response
        out["outputs"] = outputs_out(out["id"], blob, encoding=encoding)
        return json_response(out, status_code)
    out["outputs"] = None
    try:
        if len(blob) <= _INLINE_NPZ_BYTES:
            body = tensors.npz_of_blob(blob)
        else:
            body = await run_in_threadpool(tensors.npz_of_blob, blob)
    except tensors.TensorError:  # string outputs: no .npy holds them without pickle
        outputs = tensors.unpack(blob)
        out["outputs"] = {name: tensors.encode(a, encoding=encoding) for name, a in outputs.items()}
        return json_response(out, status_code)
    return Response(body, status_code=status_code, media_type=tensors.NPZ, headers=_headers(out))


async def _stored_npz(
    out: dict[str, Any], store: ObjectStore, blob: bytes, status_code: int, stored_errors: bool
) -> Response | None:
    """The .npz of a job with outputs in the store; None (answer JSON) for string outputs, and
    for a store error where `stored_errors` is false."""
    try:
        pieces, length = await npz_body(store, out["id"], blob)
    except tensors.TensorError:  # string outputs: no .npy holds them without pickle
        return None
    except (OutputsGone, StoreUnavailable) as exc:
        if stored_errors:
            raise
        log.warning("job %s answered as JSON: %s", out["id"], exc)
        return None
    out["outputs"] = None
    headers = _headers(out)
    if length is not None:
        headers["Content-Length"] = str(length)
    return StreamingResponse(
        pieces, status_code=status_code, media_type=tensors.NPZ, headers=headers
    )


def _headers(out: dict[str, Any]) -> dict[str, str]:
    return {
        "Tffleet-Job": json.dumps(out, ensure_ascii=True, separators=(",", ":")),
        "Content-Disposition": f'attachment; filename="{out["id"]}.npz"',
    }
