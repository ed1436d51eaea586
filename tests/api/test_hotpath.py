"""api/hotpath.py: which requests go past FastAPI's router, and that each answer is the one the
router's way gives (the same request sent both ways)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from api import hotpath
from tests.api.conftest import Api

ROW = [1.0, 2.0, 3.0, 4.0]
JOB = {"model": "mlp", "inputs": [ROW]}
# What differs between two jobs stored alike, one after the other.
_OWN = {"id", "created_at", "deadline_at", "queue_timeout_at", "queue_position", "eta_s"}


def scope(method: str, path: str, query: bytes = b"") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "query_string": query}


@pytest.mark.parametrize(
    ("method", "path", "query", "params"),
    [
        ("POST", "/v1/jobs", b"", {}),
        ("POST", "/v1/jobs", b"wait=5", {"wait": 5.0}),
        ("POST", "/v1/jobs", b"wait=0.25&encoding=b64", {"wait": 0.25, "encoding": "b64"}),
        ("POST", "/v1/jobs", b"encoding=json&wait=30", {"encoding": "json", "wait": 30.0}),
        ("GET", "/v1/jobs/0b7e6c1e-8a52-4c3e-9f0e-1d2c3b4a5f60", b"wait=30", {"wait": 30.0}),
    ],
)
def test_the_hot_requests_go_straight_to_their_function(
    method: str, path: str, query: bytes, params: dict[str, Any]
) -> None:
    assert hotpath.route(scope(method, path, query)) is not None
    assert hotpath.query_params(query) == params


@pytest.mark.parametrize(
    ("method", "path", "query"),
    [
        ("POST", "/v1/jobs", b"wait=31"),
        ("POST", "/v1/jobs", b"wait=30.5"),
        ("POST", "/v1/jobs", b"wait=-1"),
        ("POST", "/v1/jobs", b"wait=1e1"),
        ("POST", "/v1/jobs", b"wait="),
        ("POST", "/v1/jobs", b"wait=5&wait=6"),
        ("POST", "/v1/jobs", b"encoding=xml"),
        ("POST", "/v1/jobs", b"model=mlp"),  # a binary body's: the function reads it itself
        ("POST", "/v1/jobs", b"wait=5&"),
        ("POST", "/v1/jobs/", b""),
        ("POST", "/v1/jobs/status", b""),
        ("GET", "/v1/jobs", b""),
        ("GET", "/v1/jobs/", b""),
        ("GET", "/v1/jobs/a/cancel", b""),
        ("GET", "/v1/jobs/" + "x" * 65, b""),  # FastAPI's 422
        ("GET", "/v1/jobs/a\x00b", b""),  # FastAPI's 404
        ("DELETE", "/v1/jobs/abc", b""),
        ("PUT", "/v1/jobs", b""),
    ],
)
def test_any_other_request_goes_to_fastapi(method: str, path: str, query: bytes) -> None:
    assert hotpath.route(scope(method, path, query)) is None


# (method, path, query, json body, headers): answered alike both ways.
CASES: list[tuple[str, str, str, Any, dict[str, str]]] = [
    ("POST", "/v1/jobs", "", JOB, {}),
    ("POST", "/v1/jobs", "wait=0.05&encoding=b64", JOB, {}),
    ("POST", "/v1/jobs", "", {"jobs": [JOB, JOB]}, {}),
    ("POST", "/v1/jobs", "", {"model": "mlp", "inputs": [[1.0]]}, {}),  # 422, naming the field
    ("POST", "/v1/jobs", "", {"model": "nope", "inputs": [ROW]}, {}),  # 404
    ("POST", "/v1/jobs", "", JOB, {"Authorization": "Bearer wrong"}),  # 401
    ("POST", "/v1/jobs", "", JOB, {"Cancel-After": "soon"}),  # 422, naming the header
    ("POST", "/v1/jobs", "wait=31", JOB, {}),  # FastAPI's 422 either way
    ("GET", "/v1/jobs/0b7e6c1e-8a52-4c3e-9f0e-1d2c3b4a5f60", "", None, {}),  # 404
    ("GET", "/v1/jobs/0b7e6c1e-8a52-4c3e-9f0e-1d2c3b4a5f60", "wait=0.05", None, {}),
]


def _comparable(response: httpx.Response) -> tuple[int, Any]:
    body = response.json()
    for job in body.get("jobs", [body]) if isinstance(body, dict) else []:
        for name in _OWN & set(job):
            job[name] = "..."
    return response.status_code, body


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path", "query", "body", "headers"), CASES)
async def test_each_answer_is_the_routers(
    api: Api,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    path: str,
    query: str,
    body: Any,
    headers: dict[str, str],
) -> None:
    async def send() -> tuple[int, Any]:
        response = await api.client.request(
            method, f"{path}?{query}" if query else path, json=body, headers=headers
        )
        return _comparable(response)

    taken: list[bool] = []
    route = hotpath.route
    monkeypatch.setattr(hotpath, "route", lambda scope: taken.append(bool(c := route(scope))) or c)
    hot = await send()
    assert taken == [query != "wait=31"]  # past the router, but for what FastAPI must refuse
    monkeypatch.setattr(hotpath, "route", lambda scope: None)  # everything through the router
    assert await send() == hot


@pytest.mark.anyio
async def test_a_job_submitted_the_hot_way_reads_back_either_way(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = (await api.client.post("/v1/jobs", json=JOB)).json()

    hot = await api.client.get(f"/v1/jobs/{job['id']}")
    monkeypatch.setattr(hotpath, "route", lambda scope: None)
    routed = await api.client.get(f"/v1/jobs/{job['id']}")

    assert hot.status_code == routed.status_code == 200
    assert hot.json() == routed.json() == job
