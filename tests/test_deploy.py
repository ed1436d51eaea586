"""The deployment files agree with each other and with the code.

Every YAML file under deploy/ parses; the KEDA ScaledObject scales the worker Deployment on
gauges the API serves; every stop of a worker (Kubernetes, systemd, Compose) waits out its drain
(`worker.batching.drain_bound_s`); the worker asks for a GPU and runs one child on it; every
`TFFLEET_*` variable the files set is a real setting; the Secret the pods read is the one
deploy/README.md creates, with the object store's bucket and keys (Compose ships an S3 server,
Kubernetes takes one). docker-compose.yml follows the Compose Specification (its JSON schema, as
check-jsonschema ships it: no Docker needed), every service has an image to run, and the passwords
it uses come from .env, never from the file.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tffleet.devices import parse_devices
from tffleet.objectstore import parse_store_url
from tffleet.settings import Settings
from worker.batching import drain_bound_s

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"  # what `cp .env.example .env` gives docker compose

# The gauges the API serves on /metrics for autoscaling (docs/how-to/scale-out.md), per model (label
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


def compose_env(service: dict[str, Any]) -> dict[str, str | None]:
    """A Compose service's `environment`, map or list form: name -> value (None: from the shell)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = [str(item).partition("=") for item in env]
        return {name: value if sep else None for name, sep, value in pairs}
    return {name: None if value is None else str(value) for name, value in env.items()}


def strings(node: Any) -> Iterator[str]:
    """Every string value in a parsed YAML document."""
    if isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


# Compose's interpolation: `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?error}`,
# `${NAME?error}`, `${NAME:+other}`, `${NAME+other}` or `$NAME`; `$$` is a literal `$`.
_INTERPOLATION = re.compile(
    r"\$\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_]\w*)"
)


def interpolated(value: str) -> tuple[str, list[tuple[str, str, str]]]:
    """`value` with its i-th interpolation written `${i}` (and each `$$` dropped), and each
    interpolation's (name, operator, argument)."""
    found: list[tuple[str, str, str]] = []

    def mark(match: re.Match[str]) -> str:
        found.append((match["name"] or match["bare"], match["op"] or "", match["arg"] or ""))
        return f"${{{len(found) - 1}}}"

    return _INTERPOLATION.sub(mark, value.replace("$$", "")), found


def check_compose_schema(path: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema on a Compose file, against the Compose Specification's JSON schema that it
    ships (`vendor.compose-spec`): offline, exit status 0 when the file is valid. Run as a command
    (its documented interface), with this interpreter so that the venv's copy is the one used."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "check_jsonschema"),
            *("--builtin-schema", "vendor.compose-spec", "--color", "never", str(path)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


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
    bound = drain_bound_s(job_timeout_s(compose_env(worker)))
    assert seconds(worker["stop_grace_period"]) >= bound


# Compose


@pytest.mark.slow  # starts a process
def test_the_compose_file_follows_the_compose_specification() -> None:
    checked = check_compose_schema(COMPOSE)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# A service's `ports` as a bare number; a misspelt top-level key; a misspelt service key.
_BREAKAGES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "ports-as-a-number": (
        lambda doc: doc["services"]["api"].update(ports=8000),
        "::$.services.api.ports: ",
    ),
    "unknown-top-level-key": (lambda doc: doc.update(service={}), "::$: 'service' "),
    "unknown-service-key": (
        lambda doc: doc["services"]["worker"].update(
            stop_grace=doc["services"]["worker"].pop("stop_grace_period")
        ),
        "'stop_grace' was unexpected",
    ),
}


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("breakage", sorted(_BREAKAGES))
def test_the_schema_check_refuses_a_broken_copy_of_the_compose_file(
    tmp_path: Path, breakage: str
) -> None:
    breaks, reported = _BREAKAGES[breakage]
    doc = compose()
    breaks(doc)
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(doc, sort_keys=False))
    checked = check_compose_schema(broken)
    assert checked.returncode != 0
    # Refused for what was broken, not for anything else (a missing check_jsonschema fails too).
    assert reported in checked.stdout, checked.stdout + checked.stderr


def test_every_compose_service_has_an_image_to_run() -> None:
    services = compose()["services"]
    built = {service.get("image") for service in services.values() if "build" in service}
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        command = service.get("command") or []
        if (shlex.split(command) if isinstance(command, str) else command)[:1] == ["tffleet"]:
            # Ours is on no registry: built here, by this service or one that names the same image.
            assert "build" in service or service["image"] in built, name


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


def test_the_workers_open_their_metrics_to_the_scraper_in_another_container() -> None:
    # Loopback by default (no key guards them); monitoring.yaml scrapes the pod's port from
    # another pod, a Prometheus on the Compose network the worker service.
    worker = deployment_running("tffleet", "worker")
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    port = int(str(container_env(container)["TFFLEET_WORKER_METRICS_PORT"]))
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == port
    assert container_env(container)["TFFLEET_WORKER_METRICS_ADDRESS"] == "0.0.0.0"
    assert compose_env(compose()["services"]["worker"])["TFFLEET_WORKER_METRICS_ADDRESS"] == (
        "0.0.0.0"
    )


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
        names |= set(compose_env(service))
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


# Variables whose values are credentials, by name.
_CREDENTIAL = re.compile(r"PASSWORD|SECRET|TOKEN|BASIC_AUTH|API_KEYS?$")


def test_compose_writes_no_password_and_takes_each_from_a_required_variable() -> None:
    """A credential in docker-compose.yml is a `${NAME:?...}` (or `${NAME?...}`) interpolation, the
    whole value or a URL's password: no literal and no default, and Compose refuses to start
    without it (rather than start PostgreSQL or Redis with an empty or a known password)."""
    checked: set[str] = set()
    for service_name, service in compose()["services"].items():
        for name, value in compose_env(service).items():
            text, found = interpolated(value or "")
            if _CREDENTIAL.search(name):
                secret = text
            elif "://" in text and urlsplit(text).password is not None:
                secret = str(urlsplit(text).password)
            else:
                continue
            where = f"{service_name}: {name}={value}"
            index = re.fullmatch(r"\$\{(\d+)\}", secret)
            assert index, f"{where}: written in the file"
            assert "?" in found[int(index[1])][1], f"{where}: not required (`${{NAME:?...}}`)"
            checked.add(name)
    assert checked >= {
        *("POSTGRES_PASSWORD", "REDIS_PASSWORD", "TFFLEET_FLOWER_BASIC_AUTH"),
        *("TFFLEET_DATABASE_URL", "TFFLEET_BROKER_URL", "AWS_SECRET_ACCESS_KEY"),
    }


def test_the_env_example_sets_what_compose_requires_and_shows_each_default() -> None:
    """Each `${NAME:?...}` docker-compose.yml reads is set in .env.example, and each `${NAME:-x}`
    is shown there commented out with the same default."""
    required = env_file(ENV_EXAMPLE)
    shown = dict(re.findall(r"(?m)^#\s*([A-Z][A-Z0-9_]*)=(.*)$", ENV_EXAMPLE.read_text()))
    read = [ref for text in strings(compose()) for ref in interpolated(text)[1]]
    assert read
    for name, op, arg in read:
        if "?" in op:
            assert required.get(name), f"{name}: compose requires it, .env.example sets none"
        elif "-" in op:
            assert shown.get(name) == arg, f"{name}: .env.example shows no `# {name}={arg}`"
        else:
            assert name in required or name in shown, f"{name}: not in .env.example"


@pytest.mark.parametrize("path", [*sorted(DEPLOY.rglob("*.y*ml")), COMPOSE], ids=lambda p: p.name)
def test_no_secret_is_written_into_a_manifest(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"(postgres(ql)?|redis)://[^\s\"']*:[^@\s\"'$]+@", text), path
    assert "tff_" not in text, path


# The object store

# The processes that read or write objects: the API (uploads), workers (inputs, outputs) and the
# sweeper (it deletes a job's objects with the job).
_STORE_USERS = ("api", "worker", "sweeper")


def test_compose_ships_an_s3_service_the_fleet_uses_with_the_same_keys() -> None:
    services = compose()["services"]
    s3 = services["s3"]
    assert s3["image"].startswith("chrislusf/seaweedfs:")
    assert s3["command"][:1] == ["server"] and "-s3" in s3["command"]
    port = next(arg.split("=", 1)[1] for arg in s3["command"] if arg.startswith("-s3.port="))
    assert "ports" not in s3  # on the Compose network only
    assert any(volume.startswith("s3-data:") for volume in s3["volumes"])
    assert "s3-data" in compose()["volumes"]
    for name in _STORE_USERS:
        env = compose_env(services[name])
        assert parse_store_url(str(env["TFFLEET_OBJECT_STORE"])).scheme == "s3", name
        assert env["AWS_ENDPOINT_URL"] == f"http://s3:{port}", name
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key] == compose_env(s3)[key], (name, key)  # the identity s3 takes
        assert services[name]["depends_on"]["s3"] == {"condition": "service_healthy"}, name


def test_kubernetes_takes_the_bucket_and_its_keys_from_the_secret_and_ships_no_s3() -> None:
    for name in _STORE_USERS:
        (container,) = deployment_running("tffleet", name)["spec"]["template"]["spec"]["containers"]
        refs = {
            var["name"]: var["valueFrom"]["secretKeyRef"]
            for var in container["env"]
            if "valueFrom" in var
        }
        assert not refs["TFFLEET_OBJECT_STORE"].get("optional"), name
        # Optional: on AWS itself the endpoint is left out, and a pod role can stand for keys.
        for optional in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert refs[optional].get("optional") is True, (name, optional)
    images = [c["image"] for _, doc in manifests() for c in _pod_containers(doc)]
    assert images and not [i for i in images if re.search("seaweedfs|minio", i)]
    readme = (DEPLOY / "README.md").read_text()
    url = re.search(r"--from-literal=object-store='([^']+)'", readme)
    assert url and parse_store_url(url[1]).scheme == "s3"


def _pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    template = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(template.get("containers", []))


def test_the_systemd_hosts_share_an_s3_store_not_a_directory_each() -> None:
    example = env_file(DEPLOY / "systemd" / "tffleet.env.example")
    assert parse_store_url(example["TFFLEET_OBJECT_STORE"]).scheme == "s3"
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= example.keys()
