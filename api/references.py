"""Inputs held in the object store rather than in the job's row (DESIGN §13): inputs a client
names by URI (`{"uri": "tffleet://uploads/<id>"}`, an upload of its own tenant), and inline
inputs too large for a row, written to the store before their job is stored.

Either way the job's packed inputs hold a `tensors.Reference` (a key, and where the data lies in
that object), never the bytes. A URI is checked before anything is stored: it must name an
upload of the caller's tenant whose dtype and shape fit the signature (as an inline tensor's
must), else 422 naming the input; no other scheme is taken (the API fetches no URL). A
presigned upload's header is read from the store at its first reference and recorded.

The objects of large inline inputs are written (`ingest`) after every check passed and before
the job rows are committed, named as garbage ahead of the write until the job's transaction
claims them (api/writeahead.py); a store that fails is 503 and nothing is stored. A large `.npy`
body of a single-input model is streamed into the store as it arrives (`binary_body`), once its
header passed the signature's checks. Objects of jobs that were not stored after all (a later
check refused it, a replayed Idempotency-Key, a conflict) are deleted again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from api import npz_uploads, writeahead
from api.body import by_reference_problem, npy_stream, read_bytes
from api.ingest import Ingested, Submission
from api.schemas import JobCreate
from api.state import AppState
from api.validation import validate_inputs
from db import clock, jobs, objects
from db.ids import new_job_id
from db.models import Upload
from db.tenants import Caller
from tffleet import tensors
from tffleet.errors import InvalidInput, InvalidRequest, PayloadTooLarge
from tffleet.objectstore import ObjectMissing, keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Named:
    """An input held in the store, as its job's packed inputs will reference it: an upload
    (`upload_id`), or an object of the job's own that a streamed body was written to (`size`
    bytes, its data's sha256 `digest`; None where nothing reads it, see `hashes_read`)."""

    upload_id: str | None
    reference: tensors.Reference
    size: int = 0
    digest: bytes | None = b""


# Per job spec, in the request's order: its inputs given by URI, by name.
Uris = list[dict[str, Named]]


def hashes_read(signature: dict[str, Any], keyed: bool) -> bool:
    """Whether anything reads a job's content hash: the request hash (only with an
    Idempotency-Key) and the response cache key (only where the model caches). Neither: its
    large inputs' bytes are not hashed (12.6 MB of SHA-256 cost the API 7 ms a job)."""
    return keyed or bool((signature.get("config") or {}).get("cache"))


def is_reference(value: Any) -> bool:
    return isinstance(value, dict) and "uri" in value


def inline_inputs(inputs: dict[str, Any] | list[Any]) -> dict[str, Any] | list[Any]:
    """A spec's inputs without those it gives by URI."""
    if isinstance(inputs, dict):
        return {name: value for name, value in inputs.items() if not is_reference(value)}
    return inputs


async def resolve(state: AppState, caller: Caller, specs: Sequence[JobCreate], many: bool) -> Uris:
    """The uploads the specs' inputs name, checked to be the caller's tenant's and readable;
    422 naming the input otherwise. No database read for a request that names none."""
    named: list[dict[str, tuple[str, str | None]]] = []
    for index, spec in enumerate(specs):
        prefix = f"jobs[{index}]: " if many else ""
        inputs = spec.inputs if isinstance(spec.inputs, dict) else {}
        named.append(
            {
                name: npz_uploads.parse_uri(f"{prefix}inputs.{name}", value)
                for name, value in inputs.items()
                if is_reference(value)
            }
        )
    wanted = {upload_id for uris in named for upload_id, _ in uris.values()}
    if not wanted:
        return [{} for _ in specs]
    found = await run_in_threadpool(_read_uploads, state, caller.tenant, wanted)
    resolved: Uris = []
    for index, uris in enumerate(named):
        prefix = f"jobs[{index}]: " if many else ""
        mine = {}
        for name, (upload_id, member) in uris.items():
            where = f"{prefix}inputs.{name}"
            upload = found.get(upload_id)
            if upload is None:
                raise InvalidInput(
                    f"{where}: no upload {keys.upload_uri(upload_id)} (unknown, expired, or "
                    "another tenant's)"
                )
            if upload.size is None:  # presigned: read its header once
                upload = found[upload_id] = await _describe(state, where, upload)
            mine[name] = Named(upload_id, _reference(upload, where, name, member))
        resolved.append(mine)
    return resolved


def _read_uploads(state: AppState, tenant: str, ids: set[str]) -> dict[str, Upload]:
    """The tenant's uploads among `ids` that have not expired: an expired one may be deleted
    by the sweeper at any moment, so no new job may come to depend on it."""
    with state.sessions() as session:
        now = clock.now(session)
        found = {}
        for upload_id in ids:
            upload = objects.get_upload(session=session, tenant=tenant, upload_id=upload_id)
            if upload is not None and upload.expires_at > now:
                session.expunge(upload)
                found[upload_id] = upload
        return found


async def _describe(state: AppState, where: str, upload: Upload) -> Upload:
    """A presigned upload's header and size, read from the store and recorded."""
    uri = keys.upload_uri(upload.id)
    try:
        size = await state.objects.size_async(upload.key)
        if size is None:
            raise ObjectMissing(upload.key)
        head = await state.objects.read_prefix_async(upload.key, 12 + 10_000)
        header = tensors.read_npy_header(head)
    except ObjectMissing:
        raise InvalidInput(
            f"{where}: {uri} holds nothing yet (PUT the .npy to its upload_url)"
        ) from None
    except tensors.TensorError as exc:
        raise InvalidInput(f"{where}: {uri}: {exc}") from None
    problem = by_reference_problem(header)
    if problem is None and size != header.offset + header.nbytes:
        problem = f"holds {size - header.offset} bytes of data but its header says {header.nbytes}"
    if problem is not None:
        raise InvalidInput(f"{where}: {uri}: {problem}")
    shape = list(header.shape)
    await run_in_threadpool(_record, state, upload.id, size, header.dtype.name, shape)
    # Detached (`_read_uploads`): these change only this copy.
    upload.size, upload.dtype, upload.shape = size, header.dtype.name, shape
    return upload


def _record(state: AppState, upload_id: str, size: int, dtype: str, shape: list[int]) -> None:
    with state.sessions.begin() as session:
        objects.describe_upload(
            session=session, upload_id=upload_id, size=size, dtype=dtype, shape=shape
        )


def _reference(upload: Upload, where: str, name: str, member: str | None) -> tensors.Reference:
    """What input `name` references: the upload's array, or an .npz's member."""
    if member is not None or upload.members is not None:
        return npz_uploads.reference(upload, where, name, member)
    assert upload.size is not None and upload.dtype is not None and upload.shape is not None
    nbytes = int(np.prod(upload.shape, dtype=np.int64)) * tensors.DTYPES[upload.dtype].itemsize
    return tensors.Reference(
        key=upload.key,
        dtype=upload.dtype,
        shape=tuple(upload.shape),
        offset=upload.size - nbytes,
        nbytes=nbytes,
    )


# ─── Large inline inputs ──────────────────────────────────────────────────────────────────────────


@dataclass
class Staged:
    """Objects of the jobs of one request, by job id: to write before the jobs are stored
    (their keys and bytes), and written already (a streamed body's key)."""

    objects: dict[str, dict[str, bytes]] = field(default_factory=dict)
    written: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Packed:
    """A job's packed inputs, and what stores them beside it."""

    blob: bytes
    stored_bytes: int | None  # its own objects' bytes (None: none)
    content: bytes | None  # what its hashes read in place of `blob` (None: the blob)


def pack(
    arrays: dict[str, np.ndarray],
    uris: dict[str, Named],
    *,
    tenant: str,
    job_id: str,
    inline_max_bytes: int,
    staged: Staged | None,
    hashed: bool = True,
) -> Packed:
    """Pack a job's inputs: those in `uris` as their references, arrays over `inline_max_bytes`
    (not strings) as references to objects of the job's own, staged to be written under
    `keys.input_key` (without `staged`, every array stays inline). Not `hashed` (nothing reads
    its hashes: `hashes_read`), it has no `content`, and the objects' bytes are not hashed."""
    large = {
        name: array
        for name, array in arrays.items()
        if staged is not None and not tensors.is_string(array) and array.nbytes > inline_max_bytes
    }
    streamed = {name: named for name, named in uris.items() if named.upload_id is None}
    references = {name: named.reference for name, named in uris.items()}
    if not large and not streamed:
        return Packed(tensors.pack(arrays, references), None, None)
    inline = {name: array for name, array in arrays.items() if name not in large}
    digests: dict[str, bytes | None] = {name: named.digest for name, named in streamed.items()}
    stored = sum(named.size for named in streamed.values())
    written: dict[str, bytes] = {}
    for name, array in large.items():
        data = tensors.write_npy(array)
        key = keys.input_key(tenant, job_id, name)
        references[name] = tensors.Reference(
            key=key,
            dtype=array.dtype.name,
            shape=tuple(array.shape),
            offset=len(data) - array.nbytes,
            nbytes=array.nbytes,
        )
        written[key] = data
        if hashed:
            digests[name] = hashlib.sha256(memoryview(data)[len(data) - array.nbytes :]).digest()
        stored += len(data)
    if written:
        assert staged is not None
        staged.objects[job_id] = written
    blob = tensors.pack(inline, references)
    hashes = {name: found for name, found in digests.items() if found is not None}
    if not hashed or len(hashes) < len(digests):
        # A streamed body not hashed (its model began caching since): its cache key reads
        # the blob, whose key names the job, so it is a miss, as a cache that is off would be.
        return Packed(blob, stored, None)
    return Packed(blob, stored, _content(inline, references, hashes))


def _content(
    inline: dict[str, np.ndarray],
    references: dict[str, tensors.Reference],
    digests: dict[str, bytes],
) -> bytes:
    """What the hashes read for a job with objects of its own: their data's digests, and the
    blob with their keys (which name the job, not the bytes) and .npy header lengths (which
    differ between writers) left out. A request sent again, the same tensors as JSON or as a
    binary body, equal inputs of another job: the same content."""
    digest = hashlib.sha256()
    for name in sorted(digests):
        digest.update(digests[name])
    anonymous = {
        name: dataclasses.replace(ref, key=name, offset=0) if name in digests else ref
        for name, ref in references.items()
    }
    digest.update(tensors.pack(inline, anonymous))
    return digest.digest()


async def ingest(
    state: AppState, new: Sequence[jobs.NewJob], staged: Staged, *, placed: bool = True
) -> Ingested:
    """Write the staged objects, then store the jobs (`state.ingestor`; `placed` as
    `api.ingest.Submission` says). A store that fails is 503 with nothing stored; objects of
    jobs that end up not stored are deleted."""
    written: list[str] = []
    try:
        await writeahead.write_ahead(state, [key for job in staged.objects.values() for key in job])
        for objects_of_job in staged.objects.values():
            for key, data in objects_of_job.items():
                await state.objects.put_async(key, data)
                written.append(key)
        ingested = await state.ingestor(Submission(new, placed))
    except BaseException:
        await _discard(state, written + [key for keys_ in staged.written.values() for key in keys_])
        raise
    stored = {out["id"] for out in ingested.jobs}
    await _discard(
        state,
        [
            key
            for found in (staged.objects, staged.written)
            for job_id, keys_ in found.items()
            if job_id not in stored
            for key in keys_
        ],
    )
    return ingested


async def discard(state: AppState, staged: Staged) -> None:
    """Delete what a request wrote before it failed (a streamed body, before the checks that
    follow it refused the job)."""
    await _discard(state, [key for keys_ in staged.written.values() for key in keys_])


async def _discard(state: AppState, written: list[str]) -> None:
    """Delete objects no row names, then their written-ahead garbage rows (api/writeahead.py)."""
    await writeahead.discard(state, written)


# ─── A large .npy body, streamed into the store ───────────────────────────────────────────────────


@dataclass(frozen=True)
class Streamed:
    """A single-input job's .npy body, written to the store as it arrived: its id (the key
    names it) and its input."""

    job_id: str
    uris: dict[str, Named]


async def binary_body(
    state: AppState, request: Request, caller: Caller, spec: JobCreate, media: str, staged: Staged
) -> bytes | Streamed:
    """A binary job body: read whole (at most TFFLEET_MAX_BODY_BYTES), or, for an .npy over
    TFFLEET_INLINE_MAX_BYTES (or of no declared length) that a single-input model takes as it
    lies (its dtype, little-endian, C order), streamed into the store under the job's inputs/
    and never held whole (at most TFFLEET_MAX_UPLOAD_BYTES). Its header is checked against the
    signature before a byte is stored; what it wrote is in `staged.written`."""
    settings = state.settings
    declared = request.headers.get("content-length", "")
    if media != tensors.NPY or (declared.isdigit() and int(declared) <= settings.inline_max_bytes):
        return await read_bytes(request, max_bytes=settings.max_body_bytes)
    signature = state.signatures.cached(spec.model, spec.version)
    if signature is None:
        signature = await run_in_threadpool(state.signatures.resolve, spec.model, spec.version)
    header, chunks = await npy_stream(
        request, max_bytes=settings.max_upload_bytes, invalid=InvalidRequest
    )
    inputs = signature["inputs"]
    (name, wanted), *others = sorted(inputs.items())
    if others or header.dtype.name != wanted["dtype"] or by_reference_problem(header):
        # To be cast, or refused with the message a small body gets: read whole, as one is.
        return await _gathered(chunks, settings.max_body_bytes)
    job_id = new_job_id()
    reference = tensors.Reference(
        key=keys.input_key(caller.tenant, job_id, name),
        dtype=header.dtype.name,
        shape=header.shape,
        offset=header.offset,
        nbytes=header.nbytes,
    )
    validate_inputs({}, signature=inputs, model=spec.model, references={name: reference})
    keyed = request.headers.get("idempotency-key") is not None
    digest = hashlib.sha256() if hashes_read(signature, keyed) else None
    await writeahead.write_ahead(state, [reference.key])
    try:
        size = await state.objects.put_stream_async(
            reference.key, chunks if digest is None else _hashed(chunks, header.offset, digest)
        )
    except BaseException:
        await writeahead.discard(state, [reference.key])  # what arrived of it, if anything
        raise
    staged.written[job_id] = [reference.key]
    found = None if digest is None else digest.digest()
    return Streamed(job_id, {name: Named(None, reference, size, found)})


async def _gathered(chunks: AsyncIterable[bytes], max_bytes: int) -> bytes:
    data = bytearray()
    async for chunk in chunks:
        data += chunk
        if len(data) > max_bytes:
            raise PayloadTooLarge(f"body is over the limit of {max_bytes} bytes")
    return bytes(data)


async def _hashed(
    chunks: AsyncIterable[bytes], skip: int, digest: hashlib._Hash
) -> AsyncIterator[bytes]:
    """The chunks as they are, their bytes past the first `skip` (the header) hashed."""
    async for chunk in chunks:
        digest.update(memoryview(chunk)[skip:])
        skip = max(0, skip - len(chunk))
        yield chunk
