"""`tffleet transform` (run a model over files), `tffleet transforms` (status, list, cancel,
retry, download) and `tffleet datasets put`: the Python client's transforms on the command line.

Exit status: 0 done (a transform that succeeded, bad records or not), 1 a transform that failed
or was canceled, a refusal of the API or an API out of reach, 2 bad usage or a file that cannot
be read.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tffleet.cli.jobs import UsageError, guarded, webhook_events_of
from tffleet.fleet_env import DEFAULT_URL

if TYPE_CHECKING:
    from tffleet.client.errors import WaitTimeout
    from tffleet.client.transforms import Transform


def add_transform_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    url = os.environ.get("TFFLEET_URL", DEFAULT_URL)
    url_help = f"the API (default $TFFLEET_URL or {url})"
    run = sub.add_parser(
        "transform",
        help="run a model over every record of files; print its id (or, with --wait, the end)",
        description="INPUT: tffleet://datasets/... (put there with `tffleet datasets put`), or "
        "file:// and s3:// under the fleet's TFFLEET_TRANSFORM_LOCATIONS: a file, a folder "
        "(ending in /) or several --input. Output parts go under --output (default "
        "tffleet://transforms/<id>/); bad records to its errors/ files.",
    )
    run.add_argument("--model", required=True, help="the model's name")
    run.add_argument(
        "--input", required=True, action="append", metavar="URI", help="a file or folder (again)"
    )
    run.add_argument("--output", metavar="URI", help="where its parts go (a folder)")
    run.add_argument("--format", help="of the output: parquet, jsonl or npy (the API's default)")
    run.add_argument(
        "--input-format",
        help="parquet, tfrecord, csv, jsonl or npy (default: from the files' names)",
    )
    run.add_argument(
        "--columns",
        action="append",
        metavar="INPUT=COLUMN",
        help="the column that feeds a model input (again, or comma-separated; default: the "
        "input's own name)",
    )
    run.add_argument("--key", metavar="COLUMN", help="a column carried to the output")
    run.add_argument("--version", type=int, metavar="N", help="model version (the latest)")
    run.add_argument("--shard-records", type=int, metavar="N", help="records per shard")
    run.add_argument("--priority", type=int, metavar="P", help="higher runs first")
    run.add_argument("--webhook", metavar="URL", help="an http(s) URL told when it ends")
    run.add_argument("--webhook-events", metavar="EVENTS", help="with --webhook: which events")
    run.add_argument("--wait", action="store_true", help="wait (a bar on a terminal), print it")
    run.add_argument("--timeout", type=float, metavar="S", help="with --wait: give up after S s")
    run.add_argument("--url", default=url, help=url_help)
    run.set_defaults(func=_command(_run))

    group = sub.add_parser("transforms", help="status, list, cancel, retry or download transforms")
    commands = group.add_subparsers(dest="transforms_command", required=True, metavar="COMMAND")
    status = commands.add_parser("status", help="print a transform as JSON")
    status.add_argument("transform_id", metavar="ID")
    status.add_argument("--wait", type=float, metavar="S", help="wait up to S s for it to end")
    status.add_argument("--url", default=url, help=url_help)
    status.set_defaults(func=_command(_status))
    listing = commands.add_parser("list", help="print this key's transforms as JSON lines")
    listing.add_argument("--status", help="queued, running, succeeded, failed or canceled")
    listing.add_argument("--model", help="only those of this model")
    listing.add_argument("--limit", type=int, default=20, metavar="N", help="at most N (20)")
    listing.add_argument("--url", default=url, help=url_help)
    listing.set_defaults(func=_command(_list))
    for name, helped in (
        ("cancel", "cancel a transform: queued shards never start; print it as JSON"),
        ("retry", "run a transform's failed shards again; print it as JSON"),
    ):
        steer = commands.add_parser(name, help=helped)
        steer.add_argument("transform_id", metavar="ID")
        steer.add_argument("--url", default=url, help=url_help)
        steer.set_defaults(func=_command(_steer), action=name)
    download = commands.add_parser(
        "download", help="save a transform's output parts and errors files into a folder"
    )
    download.add_argument("transform_id", metavar="ID")
    download.add_argument("folder", metavar="FOLDER", help="made if missing")
    download.add_argument("--url", default=url, help=url_help)
    download.set_defaults(func=_command(_download))

    datasets = sub.add_parser("datasets", help="put files into the fleet's store for transforms")
    verbs = datasets.add_subparsers(dest="datasets_command", required=True, metavar="COMMAND")
    put = verbs.add_parser(
        "put",
        help="put a file at tffleet://datasets/PATH (this key's tenant's); print its URI",
        description="Exit status 1 if a file is there already (--overwrite replaces it).",
    )
    put.add_argument("file", metavar="FILE", help="the file to put")
    put.add_argument("path", metavar="URI", help="tffleet://datasets/PATH, or PATH")
    put.add_argument("--overwrite", action="store_true", help="replace a file already there")
    put.add_argument("--url", default=url, help=url_help)
    put.set_defaults(func=_command(_put))


def _command(run: Any) -> Any:
    def command(args: argparse.Namespace) -> int:
        return guarded(run, args, _show_timed_out)

    return command


def _show_timed_out(exc: WaitTimeout) -> None:
    from tffleet.client.transforms import TransformWaitTimeout

    if isinstance(exc, TransformWaitTimeout):  # any other is only its message, as a ClientError
        _print(exc.transform)


def columns_of(given: list[str] | None) -> dict[str, str] | None:
    """`--columns x=pixels,y=label` (or given again) as {input: column}."""
    if not given:
        return None
    mapping: dict[str, str] = {}
    for item in (part.strip() for text in given for part in text.split(",")):
        name, equals, column = item.partition("=")
        if not (name and equals and column):
            raise UsageError(f"--columns {item!r}: expected INPUT=COLUMN")
        mapping[name] = column
    return mapping


def _run(args: argparse.Namespace) -> int:
    from tffleet.client.sync import Client

    webhook_events = webhook_events_of(args.webhook_events)
    if webhook_events is not None and args.webhook is None:
        raise UsageError("--webhook-events needs --webhook")
    inputs = args.input[0] if len(args.input) == 1 else args.input
    with Client(args.url) as client:
        handle = client.transform(
            args.model,
            inputs,
            args.output,
            format=args.format,
            input_format=args.input_format,
            columns=columns_of(args.columns),
            key=args.key,
            version=args.version,
            shard_records=args.shard_records,
            priority=args.priority,
            webhook=args.webhook,
            webhook_events=webhook_events,
        )
        if not args.wait:
            print(handle.id)
            return 0
        done = handle.wait(timeout=args.timeout, progress=None)
    return _ended(done)


def _ended(done: Transform) -> int:
    """Print it; 0 if it succeeded (saying so on stderr where records were bad), else 1."""
    _print(done)
    if done.records_failed:
        print(
            f"tffleet: {done.records_failed} of {done.records} records were bad: see "
            f"`tffleet transforms download {done.id}` (errors/)",
            file=sys.stderr,
        )
    if not done.ok:
        print(f"tffleet: transform {done.id} {done.status}", file=sys.stderr)
    return 0 if done.ok else 1


def _status(args: argparse.Namespace) -> int:
    from tffleet.client.sync import Client

    with Client(args.url) as client:
        handle = client.get_transform(args.transform_id)
        if args.wait is None:
            _print(handle.transform)
            return 0
        return _ended(handle.wait(timeout=args.wait, progress=None))


def _list(args: argparse.Namespace) -> int:
    from tffleet.client.sync import Client

    with Client(args.url) as client:
        for transform in client.transforms(status=args.status, model=args.model, limit=args.limit):
            _print(transform)
    return 0


def _steer(args: argparse.Namespace) -> int:
    from tffleet.client.sync import Client

    with Client(args.url) as client:
        handle = client.get_transform(args.transform_id)
        _print(handle.cancel() if args.action == "cancel" else handle.retry())
    return 0


def _download(args: argparse.Namespace) -> int:
    from tffleet.client.sync import Client

    with Client(args.url) as client:
        for path in client.get_transform(args.transform_id).download(args.folder):
            print(path)
    return 0


def _put(args: argparse.Namespace) -> int:
    from tffleet.client.sync import Client

    source = Path(args.file)
    if not source.is_file():
        raise UsageError(f"{source}: no such file")
    with Client(args.url) as client:
        try:
            print(client.put_dataset(source, args.path, overwrite=args.overwrite))
        except ValueError as exc:  # a URI that is no tffleet://datasets/ one
            raise UsageError(str(exc)) from None
    return 0


def _print(transform: Transform) -> None:
    import orjson

    print(orjson.dumps(transform.to_dict()).decode())
