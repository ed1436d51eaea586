"""Content negotiation for the job API: what a submission's body is (JSON, or one job as a
binary .npz or .npy body with the rest of it in the query), and how a job is answered (JSON,
outputs as JSON lists or `b64`, or as an .npz of its outputs where `Accept` asks for one).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import Request, Response
from fastapi.concurrency import run_in_threadpool

from api.schemas import JobCreate, json_response
from api.submission import parse
from db.views import outputs_out
from tffleet import tensors
from tffleet.errors import InvalidInput

# How outputs are written in a JSON answer: nested lists, or binary envelopes.
Encoding = Literal["json", "b64"]

# Binary bodies (one job): what each holds, and the query parameters that say the rest.
BINARY = (tensors.NPZ, tensors.NPY)
ACCEPTED = ("application/json", *BINARY)
_QUERY_FIELDS = ("model", "version", "priority", "ttl_s", "webhook", "webhook_events")


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


async def answer(out: dict[str, Any], *, encoding: Encoding, status_code: int = 200) -> Response:
    """A job as JSON, or, where it was read with its outputs as their stored blob (`BLOB`), as
    an .npz of them with the job in the `Tffleet-Job` header (JSON, outputs null).

    A job with an output held in the object store (too big to inline, DESIGN §13) is answered
    as JSON, that output a reference (`db.views.outputs_out`): an .npz of it would have the API
    read it whole from the store and hold it, where `GET /v1/jobs/{id}/outputs/{name}` streams
    it. The answer's Content-Type says which it is, as for string outputs."""
    blob = out["outputs"]
    if not isinstance(blob, bytes):
        return json_response(out, status_code)
    if tensors.references(blob):
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
    headers = {
        "Tffleet-Job": json.dumps(out, ensure_ascii=True, separators=(",", ":")),
        "Content-Disposition": f'attachment; filename="{out["id"]}.npz"',
    }
    return Response(body, status_code=status_code, media_type=tensors.NPZ, headers=headers)
