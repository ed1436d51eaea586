"""Where each object lives in the store, and the URIs clients write for them (DESIGN §13).

Every key starts with the tenant's name, so a tenant's objects are one prefix (what it stores,
what to delete when it goes) and no key of one tenant can name another's object:

    <tenant>/uploads/<upload id>.npy            POST /v1/uploads (.npz: an .npz's arrays)
    <tenant>/jobs/<job id>/inputs/<name>.npy    a large input of a submitted job
    <tenant>/jobs/<job id>/outputs/<name>.npy   a large output, written by the worker

A client names an upload as `tffleet://uploads/<upload id>`; the tenant comes from its key,
never from the URI, so the URI of another tenant's upload names nothing of the caller's.
"""

from __future__ import annotations

import re
import uuid

UPLOAD_URI_PREFIX = "tffleet://uploads/"
# An upload id as the API issues them: a UUID4's hex.
_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
# One part of a key (a tenant, an id, a tensor name as signatures spell it): no "/", no "..",
# so no part can climb out of its prefix into another tenant's or job's.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}")


def new_upload_id() -> str:
    return uuid.uuid4().hex


def upload_uri(upload_id: str) -> str:
    return UPLOAD_URI_PREFIX + upload_id


def parse_upload_uri(uri: str) -> str | None:
    """The upload id a `tffleet://uploads/<id>` URI names, or None if it is not one."""
    if not uri.startswith(UPLOAD_URI_PREFIX):
        return None
    upload_id = uri[len(UPLOAD_URI_PREFIX) :]
    return upload_id if _UPLOAD_ID.fullmatch(upload_id) else None


def upload_key(tenant: str, upload_id: str, extension: str = "npy") -> str:
    """Where an upload's object is: an .npy, or an .npz of named arrays (`extension`)."""
    return f"{_checked(tenant)}/uploads/{_checked(upload_id)}.{_checked(extension)}"


def job_prefix(tenant: str, job_id: str) -> str:
    """Every object of one job is under this prefix."""
    return f"{_checked(tenant)}/jobs/{_checked(job_id)}/"


def input_key(tenant: str, job_id: str, name: str) -> str:
    return f"{job_prefix(tenant, job_id)}inputs/{_checked(name)}.npy"


def output_key(tenant: str, job_id: str, name: str) -> str:
    return f"{job_prefix(tenant, job_id)}outputs/{_checked(name)}.npy"


def _checked(name: str) -> str:
    """`name` if it can be one part of a key, else a ValueError naming it."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"{name!r} cannot name an object (one key part: letters, digits, _.:-)")
    return name
