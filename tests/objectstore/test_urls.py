"""TFFLEET_OBJECT_STORE's URLs, checked at settings load, and the keys and URIs of objects."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from tffleet.objectstore import keys, open_store, parse_store_url
from tffleet.settings import Settings


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://host/dir", "expected file:///dir or s3://bucket"),
        ("https://example.com/x", "expected file:///dir or s3://bucket"),
        ("/just/a/path", "expected file:///dir or s3://bucket"),
        ("file://otherhost/dir", "a directory store is file:///absolute/dir"),
        ("file:", "a directory store is file:///absolute/dir"),
        ("s3://", "an S3 store is s3://bucket"),
        ("s3://Upper_Case", "an S3 store is s3://bucket"),
        ("s3://ab", "an S3 store is s3://bucket"),
        ("s3://key:secret@bucket/p", "never the URL"),
        ("s3://bucket/a/../b", "prefix"),
        ("s3://bucket/a//b", "prefix"),
        ("s3://bucket/p?region=x", "no ?query"),
    ],
)
def test_a_bad_url_is_a_value_error_naming_the_setting(url: str, words: str) -> None:
    with pytest.raises(ValueError, match="TFFLEET_OBJECT_STORE") as raised:
        parse_store_url(url)
    assert words in str(raised.value)
    with pytest.raises(ValueError, match="TFFLEET_OBJECT_STORE"):
        open_store(url)


def test_good_urls_parse_to_where_they_point() -> None:
    assert parse_store_url("file:///var/objects").directory == Path("/var/objects")
    assert parse_store_url("file://localhost/var/objects").directory == Path("/var/objects")
    assert parse_store_url("file:.tffleet/objects").directory == Path(".tffleet/objects")
    where = parse_store_url("s3://my-bucket/fleet/a")
    assert (where.scheme, where.bucket, where.prefix) == ("s3", "my-bucket", "fleet/a")
    assert parse_store_url("s3://my.bucket").prefix is None


def test_settings_refuse_a_bad_store_url_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFFLEET_OBJECT_STORE", "http://example.com/bucket")
    with pytest.raises(
        ValidationError, match=re.escape("TFFLEET_OBJECT_STORE='http://example.com/b")
    ):
        Settings()
    monkeypatch.setenv("TFFLEET_OBJECT_STORE", "s3://tffleet/jobs")
    monkeypatch.setenv("TFFLEET_INLINE_MAX_BYTES", "1024")
    settings = Settings()
    assert (settings.object_store, settings.inline_max_bytes) == ("s3://tffleet/jobs", 1024)


def test_the_default_store_is_a_directory_beside_the_default_database(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TFFLEET_OBJECT_STORE", raising=False)
    monkeypatch.delenv("TFFLEET_INLINE_MAX_BYTES", raising=False)
    monkeypatch.chdir(tmp_path)
    settings = Settings()
    assert settings.inline_max_bytes == 8 * 1024
    open_store(settings.object_store).put("t/x.npy", b"1")
    assert (tmp_path / ".tffleet" / "objects" / "t" / "x.npy").read_bytes() == b"1"


def test_tffleet_up_takes_the_users_store_or_one_in_its_data_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tffleet.cli.up import _object_store

    monkeypatch.delenv("TFFLEET_OBJECT_STORE", raising=False)
    assert _object_store(tmp_path) == (tmp_path / "objects").resolve().as_uri()
    monkeypatch.setenv("TFFLEET_OBJECT_STORE", "s3://tffleet/up")
    assert _object_store(tmp_path) == "s3://tffleet/up"
    monkeypatch.setenv("TFFLEET_OBJECT_STORE", "s3://no_such:bucket")
    with pytest.raises(SystemExit, match="TFFLEET_OBJECT_STORE"):
        _object_store(tmp_path)


# ─── Keys and URIs ──────────────────────────────────────────────────────────────────────────────


def test_an_upload_uri_round_trips_and_names_its_tenants_key() -> None:
    upload_id = keys.new_upload_id()
    assert keys.parse_upload_uri(keys.upload_uri(upload_id)) == upload_id
    assert keys.upload_key("acme", upload_id) == f"acme/uploads/{upload_id}.npy"


@pytest.mark.parametrize(
    "uri",
    [
        "tffleet://uploads/",
        "tffleet://uploads/123",  # not an id the API issues
        "tffleet://uploads/" + "A" * 32,
        "tffleet://uploads/" + "0" * 32 + "/../x",
        "tffleet://uploads/../" + "0" * 32,
        "tffleet://jobs/" + "0" * 32,
        "s3://bucket/" + "0" * 32,
        "https://example.com/" + "0" * 32,
        "file:///etc/passwd",
    ],
)
def test_anything_but_an_upload_uri_names_nothing(uri: str) -> None:
    assert keys.parse_upload_uri(uri) is None


def test_job_keys_sit_under_the_tenant_and_the_job() -> None:
    assert keys.job_prefix("acme", "j1") == "acme/jobs/j1/"
    assert keys.input_key("acme", "j1", "images") == "acme/jobs/j1/inputs/images.npy"
    assert keys.output_key("acme", "j1", "serving_default:0") == (
        "acme/jobs/j1/outputs/serving_default:0.npy"
    )


@pytest.mark.parametrize("name", ["", "..", "../x", "a/b", "a..b", ".hidden", "x" * 201, "é"])
def test_a_name_that_could_leave_its_prefix_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="cannot name an object"):
        keys.input_key("acme", "j1", name)
    with pytest.raises(ValueError, match="cannot name an object"):
        keys.output_key("acme", "j1", name)
    with pytest.raises(ValueError, match="cannot name an object"):
        keys.upload_key(name, "0" * 32)
    with pytest.raises(ValueError, match="cannot name an object"):
        keys.job_prefix("acme", name)
