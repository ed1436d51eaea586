"""The deployment files agree with each other and with the code.

Every YAML file under deploy/ parses; the KEDA ScaledObject scales the worker Deployment on
gauges the API serves; every stop of a worker (Kubernetes, systemd, Compose) waits out its drain
(`worker.batching.drain_bound_s`); the worker asks for a GPU and runs one child on it; every
`TFFLEET_*` variable the files set is a real setting; the Secret the pods read is the one
deploy/README.md creates.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tffleet.devices import parse_devices
from tffleet.settings import Settings
from worker.batching import drain_bound_s

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"

# The gauges the API serves on /metrics for autoscaling (DESIGN.md section 10), per model (label
# `model`) and visible with zero workers. Named here as operators, Prometheus and KEDA see them on
# the wire, which is what the ScaledObject's queries must match.
BACKLOG_PER_CHILD = "tffleet_backlog_per_child"
BACKLOG_WITHOUT_CAPACITY = "tffleet_backlog_without_capacity"
API_GAUGES = {
    "tffleet_jobs_queued",
    "tffleet_jobs_running",
    "tffleet_oldest_queued_age_seconds",
    "tffleet_ready_children",
    BACKLOG_PER_CHILD,
    BACKLOG_WITHOUT_CAPACITY,
}

# Variables read by processes of the fleet that are not `Settings` fields.
NOT_SETTINGS = {"TFFLEET_FLOWER_BASIC_AUTH"}  # `tffleet flower` (tffleet/cli/services.py)

SETTINGS = {f"TFFLEET_{name.upper()}" for name in Settings.model_fields}
DEFAULT_JOB_TIMEOUT_S = float(Settings.model_fields["job_timeout_s"].default)


# Reading the files


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                found.append((path, doc))
    return found


def the(kind: str, name: str | None = None) -> dict[str, Any]:
    matching = [
        doc
        for _, doc in manifests()
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(matching) == 1, f"{len(matching)} {kind} {name or ''} in deploy/"
    return matching[0]


def containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) of every Deployment and Job."""
    for _, doc in manifests():
        if doc["kind"] in ("Deployment", "Job"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                yield doc, container


def deployment_running(*command: str) -> dict[str, Any]:
    matching = [
        workload
        for workload, container in containers()
        if workload["kind"] == "Deployment" and container["command"][: len(command)] == [*command]
    ]
    assert len(matching) == 1, f"{len(matching)} Deployments run {command}"
    return matching[0]


def container_env(container: dict[str, Any]) -> dict[str, str | None]:
    """name -> literal value (None when it comes from a Secret)."""
    return {var["name"]: var.get("value") for var in container.get("env", [])}


def unit(name: str) -> dict[str, list[str]]:
    """A systemd unit's keys, each with its values in order (keys may repeat)."""
    keys: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(h|min|ms|us|m|s)?")
_UNIT_S = {"h": 3600.0, "min": 60.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, None: 1.0}


def seconds(duration: str | int) -> float:
    """A duration as Compose ("1m30s") or systemd ("6min", "360") writes it."""
    text = str(duration).replace(" ", "")
    parts = _DURATION.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {duration!r}"
    return sum(float(n) * _UNIT_S[u or None] for n, u in parts)


def job_timeout_s(env: dict[str, str | None]) -> float:
    value = env.get("TFFLEET_JOB_TIMEOUT_S")
    return float(value) if value is not None else DEFAULT_JOB_TIMEOUT_S


# Every file


def test_every_yaml_file_in_deploy_parses_into_named_kubernetes_objects() -> None:
    found = manifests()
    assert {p.relative_to(DEPLOY).parts[0] for p, _ in found} == {"kubernetes", "keda"}
    for path, doc in found:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), path
        assert doc["metadata"].get("name"), path
        assert "namespace" not in doc["metadata"], f"{path}: `kubectl -n` picks the namespace"


def test_each_deployment_selects_its_own_pods_and_no_others() -> None:
    selectors = []
    for workload, _ in containers():
        if workload["kind"] != "Deployment":
            continue
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), workload["metadata"]["name"]
        selectors.append(tuple(sorted(selector.items())))
    assert len(set(selectors)) == len(selectors), "two Deployments select the same pods"


# The worker


def test_the_worker_runs_one_child_on_the_one_gpu_it_asks_for() -> None:
    worker = deployment_running("tffleet", "worker")
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["tffleet", "worker"]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus == 1
    devices = parse_devices(str(container_env(container)["TFFLEET_DEVICES"]))
    assert [d.kind for d in devices] == ["gpu"] * gpus  # "all" would fall back to a CPU slot


def test_the_worker_mounts_the_model_repository_its_settings_name() -> None:
    worker = deployment_running("tffleet", "worker")
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    repository = container_env(container)["TFFLEET_MODEL_REPOSITORY"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert repository in mounts
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[repository])
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert the("PersistentVolumeClaim", claim)


def test_kubernetes_waits_out_the_workers_drain_before_sigkill() -> None:
    worker = deployment_running("tffleet", "worker")
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    bound = drain_bound_s(job_timeout_s(container_env(container)))
    assert pod["terminationGracePeriodSeconds"] >= bound
    # SIGTERM must reach the Celery main process itself: the command is exec'd, not a shell's.
    assert container["command"][0] == "tffleet"
    # A rollout must not need a spare GPU: the old pod drains before its successor starts.
    assert worker["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def test_systemd_stops_the_worker_with_a_drain_and_waits_it_out() -> None:
    worker = unit("tffleet-worker.service")
    assert worker["ExecStart"] == ["/opt/tffleet/bin/tffleet worker"]
    assert worker["KillMode"] == ["mixed"]  # SIGTERM to the main process; SIGKILL to the rest later
    assert worker["KillSignal"] == ["SIGTERM"]
    assert worker["Restart"] == ["always"]
    assert worker["EnvironmentFile"] == ["/etc/tffleet/tffleet.env"]
    example = env_file(DEPLOY / "systemd" / "tffleet.env.example")
    bound = drain_bound_s(job_timeout_s(dict(example)))
    assert seconds(worker["TimeoutStopSec"][-1]) >= bound


def test_every_systemd_unit_runs_a_tffleet_command_from_the_environment_file() -> None:
    for name, command in [("api", "api"), ("sweeper", "sweeper"), ("worker", "worker")]:
        keys = unit(f"tffleet-{name}.service")
        argv = shlex.split(keys["ExecStart"][0])
        assert argv[:2] == ["/opt/tffleet/bin/tffleet", command], name
        assert keys["EnvironmentFile"] == ["/etc/tffleet/tffleet.env"], name
        assert keys["User"] == ["tffleet"], name


def test_compose_waits_out_the_workers_drain_before_sigkill() -> None:
    worker = compose()["services"]["worker"]
    assert worker["command"] == ["tffleet", "worker"]
    bound = drain_bound_s(job_timeout_s(worker["environment"]))
    assert seconds(worker["stop_grace_period"]) >= bound


# Autoscaling


def test_the_scaled_object_scales_the_worker_deployment_from_zero() -> None:
    scaled = the("ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment"
    assert target["name"] == deployment_running("tffleet", "worker")["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] == 0
    assert scaled["spec"]["maxReplicaCount"] >= 1


def test_its_triggers_query_gauges_the_api_serves() -> None:
    triggers = the("ScaledObject")["spec"]["triggers"]
    queried = []
    for trigger in triggers:
        assert trigger["type"] == "prometheus"
        metadata = trigger["metadata"]
        # KEDA's trigger metadata is a map of strings: a bare number is refused.
        assert all(isinstance(value, str) for value in metadata.values()), metadata
        assert {"serverAddress", "query", "threshold"} <= set(metadata)
        float(metadata["threshold"])
        float(metadata.get("activationThreshold", "0"))
        names = set(re.findall(r"\btffleet_[a-z_]+", metadata["query"]))
        assert names and names <= API_GAUGES, metadata["query"]
        queried.append(names)
    # Scales on the backlog per child; wakes from zero, when no child exists, on the other.
    assert BACKLOG_PER_CHILD in set().union(*queried)
    assert BACKLOG_WITHOUT_CAPACITY in set().union(*queried)
    per_child = next(t for t in triggers if BACKLOG_PER_CHILD in t["metadata"]["query"])
    # A per-child figure: the HPA multiplies it by the ready pods (AverageValue would divide).
    assert per_child.get("metricType") == "Value"


def test_a_trigger_authentication_named_by_a_trigger_is_defined_in_deploy() -> None:
    for trigger in the("ScaledObject")["spec"]["triggers"]:
        ref = trigger.get("authenticationRef")
        if ref is not None:
            assert ref.get("kind", "TriggerAuthentication") == "TriggerAuthentication"
            assert the("TriggerAuthentication", ref["name"])
    auth = the("TriggerAuthentication")
    assert {t["parameter"] for t in auth["spec"]["secretTargetRef"]} == {"bearerToken"}


# The API and the sweeper


def test_the_api_service_reaches_the_api_pods_and_probes_the_health_routes() -> None:
    api = deployment_running("tffleet", "api")
    (container,) = api["spec"]["template"]["spec"]["containers"]
    service = the("Service", api["metadata"]["name"])
    labels = api["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    port = int(str(container_env(container)["TFFLEET_API_PORT"]))
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[service["spec"]["ports"][0]["targetPort"]] == port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container_env(container)["TFFLEET_API_HOST"] == "0.0.0.0"


def test_one_sweeper_runs() -> None:
    sweeper = deployment_running("tffleet", "sweeper")
    assert sweeper["spec"]["replicas"] == 1


# Settings and secrets


def _k8s_env_names() -> set[str]:
    return {name for _, container in containers() for name in container_env(container)}


def test_every_tffleet_variable_the_files_set_is_a_real_setting() -> None:
    names = _k8s_env_names()
    names |= set(env_file(DEPLOY / "systemd" / "tffleet.env.example"))
    for service in compose()["services"].values():
        names |= set(service.get("environment") or {})
    ours = {n for n in names if n.startswith("TFFLEET_")}
    assert {"TFFLEET_DATABASE_URL", "TFFLEET_BROKER_URL", "TFFLEET_DEVICES"} <= ours
    assert ours - SETTINGS - NOT_SETTINGS == set()


def test_the_example_environment_file_is_valid_settings() -> None:
    example = env_file(DEPLOY / "systemd" / "tffleet.env.example")
    fields = {k.removeprefix("TFFLEET_").lower(): v for k, v in example.items()}
    Settings(**fields)  # type: ignore[arg-type]  # pydantic converts the strings


def test_every_pod_reads_the_database_and_redis_from_the_secret_the_readme_creates() -> None:
    readme = (DEPLOY / "README.md").read_text()
    created = re.search(
        r"kubectl create secret generic (\S+)((?:\s*\\\n?\s*--from-literal=\S+)+)", readme
    )
    assert created, "deploy/README.md creates no Secret"
    secret, keys = created.group(1), set(re.findall(r"--from-literal=([\w.-]+)=", created.group(2)))
    for workload, container in containers():
        refs = {
            var["name"]: var["valueFrom"]["secretKeyRef"]
            for var in container.get("env", [])
            if "valueFrom" in var
        }
        assert "TFFLEET_DATABASE_URL" in refs, workload["metadata"]["name"]
        for name, ref in refs.items():
            assert (ref["name"], ref["key"]) in {(secret, k) for k in keys}, (name, ref)
        if workload["kind"] == "Deployment":
            assert "TFFLEET_BROKER_URL" in refs, workload["metadata"]["name"]


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.y*ml")), ids=lambda p: p.name)
def test_no_secret_is_written_into_a_manifest(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"(postgres(ql)?|redis)://[^\s\"']*:[^@\s\"'$]+@", text), path
    assert "tff_" not in text, path
