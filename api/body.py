"""Reading a JSON request body: 415 if it is not JSON, 413 if too large, 400 if malformed."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request

from tffleet.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


async def read_json(request: Request, *, max_bytes: int) -> Any:
    if not _is_json(request.headers.get("content-type", "")):
        raise UnsupportedMediaType("Content-Type must be application/json")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {max_bytes} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"body is over the limit of {max_bytes} bytes")
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
