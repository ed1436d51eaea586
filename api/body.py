"""Reading a JSON request body: 415 if it is not JSON, 413 if too large, 400 if malformed.

A large body is parsed in a worker thread, and a body of more JSON items than `max_items` (by
its commas, counted before parsing) is refused: parsing holds the interpreter for its whole
length, about 0.3 s per million numbers here, while every other request of the process waits.
Large tensors travel as binary envelopes, which parse in a few milliseconds per megabyte.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import Request

from tffleet.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


# Bodies up to this size are parsed and checked on the event loop: a thread hop would cost more.
INLINE_BYTES = 64 * 1024


async def read_json(
    request: Request, *, max_bytes: int, max_items: int, any_type: bool = False
) -> Any:
    """The parsed body. `any_type`: whatever its Content-Type says (TF Serving's clients, `curl
    -d` among them, send none or a form's)."""
    if not any_type and not _is_json(request.headers.get("content-type", "")):
        raise UnsupportedMediaType("Content-Type must be application/json")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {max_bytes} bytes")
    # Gathered and counted chunk by chunk as it arrives, so no step holds the loop for long.
    # Each item of a JSON list or object but the first follows a comma: the count is an upper
    # bound (commas inside strings count too; a base64 envelope has none).
    data, items = bytearray(), 0
    async for chunk in request.stream():
        data += chunk
        items += chunk.count(b",")
        if len(data) > max_bytes:
            raise PayloadTooLarge(f"body is over the limit of {max_bytes} bytes")
        if items > max_items:
            raise PayloadTooLarge(
                f"body holds over {max_items} JSON items (TFFLEET_MAX_JSON_ITEMS); send large "
                'tensors as binary envelopes {"b64", "dtype", "shape"} (the Python client does)'
            )
    if len(data) <= INLINE_BYTES:
        return _loads(data)
    return await asyncio.to_thread(_loads, data)


def _loads(data: bytes | bytearray) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None


async def read_bytes(request: Request, *, max_bytes: int) -> bytes:
    """The whole body, 413 past `max_bytes`: the chunks as they arrive, joined once."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {max_bytes} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"body is over the limit of {max_bytes} bytes")
        if chunk:
            chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
