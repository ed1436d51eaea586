"""The schema at /openapi.json declares the bearer scheme, so /docs has an Authorize button, and
requires it on exactly the operations that answer 401 without a key."""

from __future__ import annotations

import re
from typing import Any

import pytest

from api.openapi import BEARER, UNKEYED
from tests.api.conftest import Api, OpenApi

pytestmark = pytest.mark.anyio

# A value for each path parameter that passes its validation, so a refusal can only be the key's.
_PARAMETERS = {"job_id": "01890000-0000-7000-8000-000000000000", "version": "1"}


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
    ]


async def test_the_schema_declares_the_bearer_scheme(api: Api) -> None:
    schema = (await api.client.get("/openapi.json")).json()

    scheme = schema["components"]["securitySchemes"][BEARER]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")


async def test_every_operation_that_answers_401_without_a_key_requires_it(api: Api) -> None:
    schema = (await api.client.get("/openapi.json")).json()
    del api.client.headers["Authorization"]
    operations = _operations(schema)
    assert {(method, path) for method, path, _ in operations} >= UNKEYED  # no stale entry

    for method, path, operation in operations:
        url = re.sub(r"\{(\w+)\}", lambda m: _PARAMETERS.get(m[1], "mlp"), path)
        response = await api.client.request(method, url, json={"ids": [_PARAMETERS["job_id"]]})

        keyed = (method, path) not in UNKEYED
        assert (response.status_code == 401) is keyed, (method, path, response.text)
        assert operation.get("security") == ([{BEARER: []}] if keyed else None), (method, path)


async def test_public_metrics_and_no_auth_take_no_key_in_the_schema(open_api: OpenApi) -> None:
    async with open_api(metrics_public=True) as api:
        schema = (await api.client.get("/openapi.json")).json()
    assert "security" not in schema["paths"]["/metrics"]["get"]
    assert schema["paths"]["/v1/jobs"]["post"]["security"] == [{BEARER: []}]

    async with open_api(auth=False) as api:
        schema = (await api.client.get("/openapi.json")).json()
    assert "securitySchemes" not in schema["components"]
    assert all("security" not in operation for _, _, operation in _operations(schema))
