"""The protocol facades' cost: one client, one one-sample MLP request at a time, nothing else
queued, through each way in, measured in turns (three rounds each, medians of the p50s):

    (a) tffleet's own   POST /v1/jobs?wait=30 (JSON)
    (b) Open Inference Protocol, binary   POST /v2/models/mlp/infer as tritonclient.http sends it
        by default: a JSON header and the input's bytes, every output asked for as binary data
    (c) Open Inference Protocol, JSON   POST /v2/models/mlp/infer with JSON tensors
    (d) TF Serving REST   POST /v1/models/mlp:predict {"instances": ...}

then each facade's p50 as a ratio of (a) (target <= 1.2), and the client's CPU per request.

    .venv/bin/python -m bench.protocols [--jobs 200] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

from bench import run
from bench.rawhttp import Connection, Response
from tffleet.cli.process_group import ProcessGroup

Check = Callable[[Response], bool]


def _requests(conn: Connection) -> dict[str, tuple[bytes, Check]]:
    """Each way in: its request, encoded once, and how to tell its answer is a success."""
    x = np.random.default_rng(1).normal(size=(1, run.MLP_IN)).astype(np.float32)
    binary_head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1, run.MLP_IN],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    json_infer = {"inputs": [{"name": "x", "shape": [1, run.MLP_IN], "datatype": "FP32"}]}
    json_infer["inputs"][0]["data"] = x.reshape(-1).tolist()

    def ok(response: Response) -> bool:
        return response.status == 200

    def succeeded(response: Response) -> bool:
        return orjson.loads(response.body)["status"] == "succeeded"

    return {
        "a": (conn.post_bytes("/v1/jobs?wait=30", run.one_sample_body("mlp")), succeeded),
        "b": (
            conn.post_bytes(
                "/v2/models/mlp/infer",
                binary_head + x.tobytes(),
                content_type="application/octet-stream",
                headers={"Inference-Header-Content-Length": str(len(binary_head))},
            ),
            ok,
        ),
        "c": (conn.post_bytes("/v2/models/mlp/infer", orjson.dumps(json_infer)), ok),
        "d": (
            conn.post_bytes("/v1/models/mlp:predict", orjson.dumps({"instances": x.tolist()})),
            ok,
        ),
    }


def rounds(fleet: run.Fleet, *, jobs: int, rounds: int) -> dict[str, run.Result]:
    """Each way in, `rounds` times in turns; the median round of each."""

    async def measure() -> dict[str, list[run.Result]]:
        conn = await fleet.connect()
        ways = _requests(conn)
        results: dict[str, list[run.Result]] = {key: [] for key in ways}

        async def one(key: str) -> run.Result:
            raw, check = ways[key]
            for _ in range(10):  # warm up
                response = await conn.request(raw)
                if not check(response):
                    raise RuntimeError(f"({key}) failed: {response.status} {response.body[:300]!r}")
            latencies = []
            cpu = time.process_time()
            for _ in range(jobs):
                started = time.perf_counter()
                response = await conn.request(raw)
                latencies.append(time.perf_counter() - started)
                if not check(response):
                    raise RuntimeError(f"({key}) failed: {response.status} {response.body[:300]!r}")
            cpu = time.process_time() - cpu
            latencies.sort()
            return run.Result(
                jobs / sum(latencies), latencies[len(latencies) // 2] * 1000,
                client_cpu_ms=cpu / jobs * 1000,
            )  # fmt: skip

        for _ in range(rounds):
            for key in ways:
                results[key].append(await one(key))
        await conn.close()
        return results

    measured = asyncio.run(measure())
    return {
        key: sorted(results, key=lambda r: r.p50_ms)[len(results) // 2]
        for key, results in measured.items()
    }


_NAMES = {
    "a": "(a) POST /v1/jobs?wait=30             ",
    "b": "(b) v2 infer, binary (tritonclient's) ",
    "c": "(c) v2 infer, JSON tensors            ",
    "d": "(d) TF Serving :predict (instances)   ",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="requests per way per round")
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary directory")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # this process is the client
    with tempfile.TemporaryDirectory(prefix="tffleet-bench-") as tmp:
        work = Path(tmp)
        repository = work / "models"
        run.build_models(repository)
        group = ProcessGroup()
        try:
            port = run.start_redis(group, tmp)
            database_url = args.database_url or f"sqlite:///{work / 'tffleet.db'}"
            fleet = run.start_fleet(
                group, repository, f"redis://127.0.0.1:{port}/0", database_url, "cpu:1"
            )
            results = rounds(fleet, jobs=args.jobs, rounds=3)
        finally:
            group.stop()
    base = results["a"].p50_ms
    print()
    for key, name in _NAMES.items():
        r = results[key]
        ratio = "" if key == "a" else f"   {r.p50_ms / base:.2f}x of (a)"
        print(f"{name} p50 {r.p50_ms:6.2f} ms  client CPU {r.client_cpu_ms:5.2f} ms/req{ratio}")
    print("target: (b), (c) and (d) each <= 1.2x of (a)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
