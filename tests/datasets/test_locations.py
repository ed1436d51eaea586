"""What a transform may read and write: the fleet's store under the caller's tenant, and the
prefixes the operator allows; everything else refused with a message naming the URI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import S3_BUCKET
from tests.datasets.conftest import TENANT
from tffleet.datasets import access
from tffleet.datasets.locations import LocationRefused, expand, parse_allowed, resolve
from tffleet.settings import Settings


def test_fleet_uris_are_the_callers_tenant(settings: Settings) -> None:
    found = resolve("tffleet://datasets/a/b.parquet", TENANT, settings)
    assert found.key == "acme/datasets/a/b.parquet"
    assert found.uri == "tffleet://datasets/a/b.parquet"
    out = resolve("tffleet://transforms/t1/part-00000.parquet", TENANT, settings, write=True)
    assert out.key == "acme/transforms/t1/part-00000.parquet"
    # Another tenant's name in the path is only a folder of the caller's own.
    assert resolve("tffleet://datasets/other/x", TENANT, settings).key == "acme/datasets/other/x"


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("http://example.com/a.csv", "http:// is never read"),
        ("https://example.com/a.csv", "https:// is never read"),
        ("/etc/passwd", "a bare path:// is never read"),
        ("tffleet://uploads/0123", "not tffleet://uploads/"),
        ("tffleet://datasets/", "names no file or folder"),
        ("tffleet://datasets/a/../../other/datasets/x", "no empty, . or .. part"),
        ("tffleet://datasets/a//b", "no empty, . or .. part"),
        ("file:///etc/passwd", "not under a location the fleet allows to be read"),
        ("s3://elsewhere/a.csv", "not under a location the fleet allows to be read"),
        (f"s3://{S3_BUCKET}/other/a.csv", "not under a location the fleet allows"),
        ("tffleet://datasets/a.csv?x=1", "no ?query"),
    ],
)
def test_refused_uris_name_themselves(settings: Settings, uri: str, says: str) -> None:
    with pytest.raises(LocationRefused) as refused:
        resolve(uri, TENANT, settings)
    assert str(refused.value).startswith(uri.split("?")[0]) and says in str(refused.value)


@pytest.mark.parametrize("uri", ["tffleet://datasets/a/b|", "tffleet://transforms/c:/"])
def test_a_part_ending_with_a_colon_or_a_bar_is_refused_for_a_write_only(
    settings: Settings, uri: str
) -> None:
    # obstore's directory store cannot write such a file; another store may hold one to read.
    with pytest.raises(LocationRefused, match=r"may not end with ':' or '\|'"):
        resolve(uri, TENANT, settings, write=True)
    assert resolve(uri, TENANT, settings).uri == uri


def test_allowed_directory_not_beyond_it(settings: Settings, allowed_dir: Path) -> None:
    (allowed_dir / "d").mkdir()
    (allowed_dir / "d" / "a.csv").write_bytes(b"x\n1\n")
    (allowed_dir / "d" / "b.csv").write_bytes(b"x\n2\n")
    found = resolve(f"{allowed_dir.as_uri()}/d/a.csv", TENANT, settings)
    assert found.key == "d/a.csv" and access.read_range(found, 0, 3) == b"x\n1"
    files = expand(f"{allowed_dir.as_uri()}/d/", TENANT, settings)
    assert [f.uri for f in files] == [f"{allowed_dir.as_uri()}/d/{n}.csv" for n in "ab"]
    assert access.read_range(files[1], 0, 3) == b"x\n2"
    for uri in (f"{allowed_dir.as_uri()}/../x.csv", f"{allowed_dir.as_uri()}/d/../../x.csv"):
        with pytest.raises(LocationRefused, match=r"no empty, \. or \.\. part"):
            resolve(uri, TENANT, settings)
    # A link that leads out of the allowed directory leads nowhere.
    (allowed_dir / "out").symlink_to(allowed_dir.parent)
    with pytest.raises(LocationRefused, match="not under a location the fleet allows"):
        resolve(f"{allowed_dir.as_uri()}/out/secret", TENANT, settings)


def test_the_fleets_store_is_named_by_tffleet_uris_only(tmp_path: Path) -> None:
    own = tmp_path / "objects"
    settings = Settings(object_store=own.as_uri(), transform_locations=f"{tmp_path.as_uri()}/")
    assert resolve(f"{tmp_path.as_uri()}/data/a.csv", TENANT, settings).key == "data/a.csv"
    with pytest.raises(LocationRefused, match=r"objects/other/datasets/a\.csv: not under"):
        resolve(f"{own.as_uri()}/other/datasets/a.csv", TENANT, settings)
    settings = Settings(
        object_store=f"s3://{S3_BUCKET}/fleet", transform_locations=f"s3://{S3_BUCKET}/"
    )
    assert resolve(f"s3://{S3_BUCKET}/data/a.csv", TENANT, settings).key == "data/a.csv"
    with pytest.raises(LocationRefused, match="not under a location"):
        resolve(f"s3://{S3_BUCKET}/fleet/other/datasets/a.csv", TENANT, settings)


def test_the_setting_refuses_what_is_no_prefix() -> None:
    assert [a.url for a in parse_allowed(" file:///srv/d/ , s3://bucket/p/ ,")] == [
        "file:///srv/d/",
        "s3://bucket/p/",
    ]
    for bad in ("http://host/d/", "file:relative/", "s3://user:pw@bucket/", "/srv/d"):
        with pytest.raises(ValueError, match="TFFLEET_TRANSFORM_LOCATIONS"):
            Settings(transform_locations=bad)


def test_a_prefix_expands_to_its_files_sorted(settings: Settings, put) -> None:  # type: ignore[no-untyped-def]
    for name in ("part-2.csv", "part-10.csv", "part-1.csv", "_SUCCESS", ".part-1.csv.crc"):
        put(f"set/{name}", b"x\n1\n")
    put("set/sub/part-0.csv", b"x\n1\n")
    put("setter.csv", b"x\n1\n")
    for uri in ("tffleet://datasets/set/", "tffleet://datasets/set"):
        files = expand(uri, TENANT, settings)
        assert [f.uri for f in files] == [
            "tffleet://datasets/set/part-1.csv",
            "tffleet://datasets/set/part-10.csv",
            "tffleet://datasets/set/part-2.csv",
            "tffleet://datasets/set/sub/part-0.csv",
        ]
        assert files[0].key == "acme/datasets/set/part-1.csv"
    listed = expand(
        ["tffleet://datasets/setter.csv", "tffleet://datasets/set/sub/"], TENANT, settings
    )
    assert [f.key for f in listed] == [
        "acme/datasets/setter.csv",
        "acme/datasets/set/sub/part-0.csv",
    ]
    with pytest.raises(LocationRefused, match="tffleet://datasets/nothing: no such file"):
        expand("tffleet://datasets/nothing", TENANT, settings)


@pytest.mark.parametrize("object_store_url", ["s3"], indirect=True)
def test_an_allowed_prefix_on_s3_expands(settings: Settings) -> None:
    first = resolve(f"s3://{S3_BUCKET}/allowed/t/a.jsonl", TENANT, settings)
    first.store.put(first.key, b'{"x": 1}\n')
    files = expand(f"s3://{S3_BUCKET}/allowed/t/", TENANT, settings)
    assert [f.key for f in files] == ["allowed/t/a.jsonl"]
    assert files[0].store is first.store  # one store per bucket
