"""The model repository on disk: what a scan serves, and what model.toml may say."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from worker.repository import ModelConfig, ModelSpec, model_names, read_config, scan


def version_dir(repository: Path, name: str, version: str, *, saved_model: bool = True) -> Path:
    path = repository / name / version
    path.mkdir(parents=True)
    if saved_model:
        (path / "saved_model.pb").write_bytes(b"")
    return path


def config_file(repository: Path, name: str, text: str) -> None:
    (repository / name).mkdir(parents=True, exist_ok=True)
    (repository / name / "model.toml").write_text(text)


def found(specs: list[ModelSpec]) -> list[tuple[str, int]]:
    return [(spec.name, spec.version) for spec in specs]


# scan


def test_scan_finds_every_version_holding_a_saved_model_in_version_order(tmp_path: Path) -> None:
    for name, version in [("b", "1"), ("a", "10"), ("a", "2"), ("a", "1")]:
        version_dir(tmp_path, name, version)

    specs = scan(tmp_path)

    assert found(specs) == [("a", 1), ("a", 2), ("a", 10), ("b", 1)]
    first = specs[0]
    assert first.path == tmp_path / "a" / "1"
    assert first.format == "saved_model"
    assert first.config == ModelConfig()


@pytest.mark.parametrize("version", ["latest", "v1", "0", "01", "1.0", "-1", "²", "1234567890"])
def test_scan_ignores_version_directories_that_are_not_a_plain_positive_number(
    tmp_path: Path, version: str
) -> None:
    version_dir(tmp_path, "m", "3")
    version_dir(tmp_path, "m", version)

    assert found(scan(tmp_path)) == [("m", 3)]


def test_scan_ignores_models_without_versions_and_files_in_the_repository(tmp_path: Path) -> None:
    version_dir(tmp_path, "served", "1")
    (tmp_path / "empty").mkdir()
    version_dir(tmp_path, "docs_only", "notes")
    (tmp_path / "README.md").write_text("models live here")
    (tmp_path / "served" / "1.txt").write_text("not a version")

    assert model_names(tmp_path) == ["served"]
    assert found(scan(tmp_path)) == [("served", 1)]


def test_scan_ignores_directories_that_are_not_valid_model_names(tmp_path: Path) -> None:
    version_dir(tmp_path, "ok-name_1.2", "1")
    version_dir(tmp_path, ".hidden", "1")
    version_dir(tmp_path, "with space", "1")

    assert found(scan(tmp_path)) == [("ok-name_1.2", 1)]


def test_scan_of_a_missing_repository_finds_nothing(tmp_path: Path) -> None:
    assert scan(tmp_path / "nowhere") == []


def test_scan_skips_and_logs_a_version_without_saved_model_pb(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    version_dir(tmp_path, "m", "1")
    version_dir(tmp_path, "m", "2", saved_model=False)

    with caplog.at_level(logging.ERROR, logger="worker.repository"):
        specs = scan(tmp_path)

    assert found(specs) == [("m", 1)]
    assert "no model in it" in caplog.text and str(tmp_path / "m" / "2") in caplog.text


def test_scan_gives_each_model_its_own_config_and_the_rest_the_defaults(tmp_path: Path) -> None:
    version_dir(tmp_path, "tuned", "1")
    version_dir(tmp_path, "plain", "1")
    config_file(tmp_path, "tuned", 'signature = "predict"\nmax_batch_size = 8\n')
    defaults = ModelConfig(max_batch_size=64, max_queue_delay_ms=5.0)

    specs = {spec.name: spec for spec in scan(tmp_path, defaults=defaults)}

    assert specs["plain"].config == defaults
    assert specs["tuned"].config == ModelConfig(
        signature="predict", max_batch_size=8, max_queue_delay_ms=5.0
    )


def test_scan_skips_a_model_whose_config_is_bad_and_logs_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    version_dir(tmp_path, "good", "1")
    version_dir(tmp_path, "bad", "1")
    config_file(tmp_path, "bad", "max_batch_sise = 8\n")

    with caplog.at_level(logging.ERROR, logger="worker.repository"):
        specs = scan(tmp_path)

    assert found(specs) == [("good", 1)]
    assert "skipping model bad" in caplog.text
    assert "max_batch_sise" in caplog.text


def test_scan_skips_a_model_whose_config_is_not_toml(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    version_dir(tmp_path, "bad", "1")
    config_file(tmp_path, "bad", "max_batch_size = = 8\n")

    with caplog.at_level(logging.ERROR, logger="worker.repository"):
        assert scan(tmp_path) == []

    assert "skipping model bad" in caplog.text


# model.toml


def test_read_config_reads_every_key(tmp_path: Path) -> None:
    config_file(
        tmp_path,
        "m",
        'signature = "serve"\nmax_batch_size = 32\nmax_queue_delay_ms = 0.5\n'
        "buckets = [1, 4, 32]\n",
    )

    config = read_config(tmp_path / "m", defaults=ModelConfig())

    assert config == ModelConfig(
        signature="serve", max_batch_size=32, max_queue_delay_ms=0.5, buckets=(1, 4, 32)
    )


def test_read_config_without_a_file_returns_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    defaults = ModelConfig(max_batch_size=16)

    assert read_config(tmp_path / "m", defaults=defaults) is defaults


def test_read_config_keeps_defaults_for_keys_it_does_not_set(tmp_path: Path) -> None:
    config_file(tmp_path, "m", "max_queue_delay_ms = 10\n")

    config = read_config(tmp_path / "m", defaults=ModelConfig(max_batch_size=16))

    assert config == ModelConfig(max_batch_size=16, max_queue_delay_ms=10)


def test_read_config_rejects_unknown_keys_naming_them_and_the_known_ones(tmp_path: Path) -> None:
    config_file(tmp_path, "m", "max_batch = 8\ndevice = [0]\n")

    with pytest.raises(ValueError) as raised:
        read_config(tmp_path / "m", defaults=ModelConfig())

    message = str(raised.value)
    assert str(tmp_path / "m" / "model.toml") in message
    assert "unknown keys ['device', 'max_batch']" in message
    assert (
        "known keys are ['buckets', 'cache', 'cache_shared', 'devices', 'format', 'inputs', "
        "'max_batch_size', 'max_queue_delay_ms', 'outputs', 'signature', 'timeout_s', "
        "'versions', 'warmup']" in message
    )


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("max_batch_size = 0", "max_batch_size must be an integer of at least 1, got 0"),
        ("max_batch_size = 8.5", "max_batch_size must be an integer of at least 1, got 8.5"),
        ('max_batch_size = "8"', "max_batch_size must be an integer of at least 1, got '8'"),
        ("max_batch_size = true", "max_batch_size must be an integer of at least 1, got True"),
        ("max_queue_delay_ms = -1", "max_queue_delay_ms must be a number of at least 0, got -1"),
        ('max_queue_delay_ms = "2"', "max_queue_delay_ms must be a number of at least 0"),
        ("max_queue_delay_ms = inf", "max_queue_delay_ms must be a number of at least 0"),
        ("buckets = [0, 8]", "buckets must be a list of integers of at least 1, got [0, 8]"),
        ("buckets = [1.5]", "buckets must be a list of integers of at least 1, got [1.5]"),
        ('buckets = "1,2"', "buckets must be a list of integers of at least 1, got '1,2'"),
        ("signature = 3", "signature must be a non-empty string, got 3"),
        ('signature = ""', "signature must be a non-empty string, got ''"),
        ("timeout_s = 0", "timeout_s must be a number above 0, got 0"),
        ("timeout_s = -1.5", "timeout_s must be a number above 0, got -1.5"),
        ('timeout_s = "30"', "timeout_s must be a number above 0, got '30'"),
        ("timeout_s = inf", "timeout_s must be a number above 0, got inf"),
    ],
)
def test_read_config_rejects_values_of_the_wrong_type_or_range(
    tmp_path: Path, line: str, complaint: str
) -> None:
    config_file(tmp_path, "m", line + "\n")

    with pytest.raises(ValueError, match=r"model\.toml: ") as raised:
        read_config(tmp_path / "m", defaults=ModelConfig())

    assert complaint in str(raised.value)


# buckets


@pytest.mark.parametrize(
    ("max_batch_size", "sizes"),
    [
        (1, (1,)),
        (2, (1, 2)),
        (8, (1, 2, 4, 8)),
        (100, (1, 2, 4, 8, 16, 32, 64, 100)),
        (128, (1, 2, 4, 8, 16, 32, 64, 128)),
    ],
)
def test_bucket_sizes_default_to_powers_of_two_up_to_max_batch_size(
    max_batch_size: int, sizes: tuple[int, ...]
) -> None:
    assert ModelConfig(max_batch_size=max_batch_size).bucket_sizes() == sizes


def test_configured_buckets_are_sorted_deduplicated_capped_and_end_at_max_batch_size() -> None:
    config = ModelConfig(max_batch_size=32, buckets=(16, 4, 4, 64, 1))

    assert config.bucket_sizes() == (1, 4, 16, 32)


def test_as_dict_reports_the_buckets_in_use() -> None:
    config = ModelConfig(signature="s", max_batch_size=4, max_queue_delay_ms=1.0)

    assert config.as_dict() == {
        "signature": "s",
        "max_batch_size": 4,
        "max_queue_delay_ms": 1.0,
        "buckets": [1, 2, 4],
        "timeout_s": 300.0,
        "format": None,
        "inputs": {},
        "outputs": {},
        "devices": [],
        "versions": "latest",
        "warmup": None,
        "cache": False,
        "cache_shared": False,
    }


def test_a_models_time_limit_overrides_the_default_and_reads_as_seconds(tmp_path: Path) -> None:
    config_file(tmp_path, "slow", "timeout_s = 2\n")

    config = read_config(tmp_path / "slow", defaults=ModelConfig(timeout_s=30.0))

    assert config.timeout_s == 2.0 and isinstance(config.timeout_s, float)
    assert read_config(tmp_path / "other", defaults=ModelConfig(timeout_s=30.0)).timeout_s == 30


@pytest.mark.parametrize("text", ['cache = "yes"\n', "cache_shared = 1\n"])
def test_read_config_takes_the_cache_flags_only_as_booleans(tmp_path: Path, text: str) -> None:
    config_file(tmp_path, "m", text)

    with pytest.raises(ValueError, match="must be true or false"):
        read_config(tmp_path / "m", defaults=ModelConfig())


def test_read_config_turns_the_response_cache_on(tmp_path: Path) -> None:
    config_file(tmp_path, "m", "cache = true\ncache_shared = true\n")

    config = read_config(tmp_path / "m", defaults=ModelConfig())

    assert (config.cache, config.cache_shared) == (True, True)
    assert config.as_dict()["cache"] is True
