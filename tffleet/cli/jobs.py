"""`tffleet submit`, `status`, `retry` and `delete`: the Python client on the command line.

Exit status: 0 done, 1 a job failed or the API refused or could not be reached, 2 bad usage or
an input file that cannot be read.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tffleet.fleet_env import DEFAULT_URL

if TYPE_CHECKING:
    from tffleet.client.errors import WaitTimeout
    from tffleet.client.job import Job

_ENVELOPE = frozenset({"b64", "dtype", "shape"})


class UsageError(Exception):
    """A bad argument or input file: reported as `tffleet: ...`, exit status 2."""


def add_job_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    url = os.environ.get("TFFLEET_URL", DEFAULT_URL)

    submit = sub.add_parser(
        "submit",
        help="submit a job from a .npy, .npz or JSON file; print its id (or, with --wait, result)",
        description="INPUT: a .npy file (one array: the batch of a single-input model), a .npz "
        "file (inputs by name), or a .json file or - (stdin) holding the job's `inputs`.",
    )
    submit.add_argument("model", metavar="MODEL", help="the model's name")
    submit.add_argument("input", metavar="INPUT", help="a .npy, .npz or .json file, or - (stdin)")
    submit.add_argument(
        "--version", type=int, metavar="N", help="model version (default: the latest)"
    )
    submit.add_argument(
        "--priority", type=int, default=0, metavar="P", help="higher runs first (default 0)"
    )
    submit.add_argument("--split", action="store_true", help="one job per sample of the batch")
    submit.add_argument(
        "--cancel-after",
        metavar="DURATION",
        help="cancel a job not ended by then: seconds (30, 1.5) or 90s, 5m, 1h30m, 250ms",
    )
    submit.add_argument(
        "--queue-timeout",
        metavar="DURATION",
        help="cancel a job no worker started by then, without running it (as --cancel-after)",
    )
    submit.add_argument(
        "--webhook",
        metavar="URL",
        help="an http(s) URL that gets each job, signed, at the events of --webhook-events",
    )
    submit.add_argument(
        "--webhook-events",
        metavar="EVENTS",
        help="with --webhook: start, completed or start,completed (default completed)",
    )
    submit.add_argument("--wait", action="store_true", help="wait and print the results as JSON")
    submit.add_argument("--timeout", type=float, metavar="S", help="with --wait: give up after S s")
    submit.add_argument("--output", metavar="FILE", help="wait, and save the outputs to FILE.npz")
    submit.add_argument("--url", default=url, help=f"the API (default $TFFLEET_URL or {url})")
    submit.set_defaults(func=cmd_submit)

    status = sub.add_parser(
        "status",
        help="print jobs as JSON lines",
        description="Exit status 1 if, with --wait, some are still unfinished after S seconds; "
        "with --follow, if the job did not succeed.",
    )
    status.add_argument("job_ids", nargs="+", metavar="JOB_ID", help="one or more job ids")
    how = status.add_mutually_exclusive_group()
    how.add_argument("--wait", type=float, metavar="S", help="wait up to S s for them to end")
    how.add_argument(
        "--follow",
        action="store_true",
        help="one job: print it now and at each change of its status, until it ends",
    )
    status.add_argument("--url", default=url, help=f"the API (default $TFFLEET_URL or {url})")
    status.set_defaults(func=cmd_status)

    retry = sub.add_parser(
        "retry",
        help="run a failed or canceled job again under its id; print it as JSON",
        description="The job goes back to queued, its error and outputs cleared, with a fresh "
        "attempt budget. Exit status 1 if it is queued, running or succeeded, or unknown.",
    )
    retry.add_argument("job_id", metavar="JOB_ID", help="the job to run again")
    retry.add_argument(
        "--cancel-after", metavar="DURATION", help="a new deadline, as for `tffleet submit`"
    )
    retry.add_argument(
        "--queue-timeout",
        metavar="DURATION",
        help="a new queue time-out, as for `tffleet submit`",
    )
    retry.add_argument("--url", default=url, help=f"the API (default $TFFLEET_URL or {url})")
    retry.set_defaults(func=cmd_retry)

    delete = sub.add_parser(
        "delete",
        help="delete an ended job with its inputs and outputs",
        description="Exit status 1 if the job is queued or running (cancel it first), or unknown.",
    )
    delete.add_argument("job_id", metavar="JOB_ID", help="the job to delete")
    delete.add_argument("--url", default=url, help=f"the API (default $TFFLEET_URL or {url})")
    delete.set_defaults(func=cmd_delete)


def cmd_submit(args: argparse.Namespace) -> int:
    return guarded(_submit, args, _show_timed_out)


def cmd_status(args: argparse.Namespace) -> int:
    return guarded(_status, args, _show_timed_out)


def cmd_retry(args: argparse.Namespace) -> int:
    return guarded(_retry, args, _show_timed_out)


def cmd_delete(args: argparse.Namespace) -> int:
    return guarded(_delete, args, _show_timed_out)


def guarded(
    command: Any, args: argparse.Namespace, show_timed_out: Callable[[WaitTimeout], None]
) -> int:
    """Run a command, its errors as `tffleet: ...` and an exit status (see the module's docstring).

    Shared by every client command so that each says the same thing for the same failure;
    `show_timed_out` prints what a wait that ran out last saw, before the message.
    """
    from tffleet.client.errors import ClientError, ConnectError, WaitTimeout

    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per request
    try:
        return int(command(args))
    except UsageError as exc:
        print(f"tffleet: {exc}", file=sys.stderr)
        return 2
    except WaitTimeout as exc:
        show_timed_out(exc)
        print(f"tffleet: {exc}", file=sys.stderr)
        return 1
    except ConnectError as exc:
        print(f"tffleet: cannot reach the API at {args.url} ({exc})", file=sys.stderr)
        return 1
    except ClientError as exc:
        print(f"tffleet: {exc}", file=sys.stderr)
        return 1


def _show_timed_out(exc: WaitTimeout) -> None:
    _print_jobs(exc.jobs)


def _submit(args: argparse.Namespace) -> int:
    from tffleet.client.sync import Client

    output = Path(args.output) if args.output else None
    if output is not None and output.suffix != ".npz":
        raise UsageError(f"{output}: --output must name a .npz file")
    webhook_events = webhook_events_of(args.webhook_events)
    if webhook_events is not None and args.webhook is None:
        raise UsageError("--webhook-events needs --webhook")
    inputs = read_inputs(args.input)
    with Client(args.url) as client:
        if not args.split:
            job = client.submit(
                args.model,
                inputs,
                version=args.version,
                priority=args.priority,
                cancel_after=args.cancel_after,
                queue_timeout=args.queue_timeout,
                webhook=args.webhook,
                webhook_events=webhook_events,
            )
            if not (args.wait or output):
                print(job.id)
                return 0
            jobs = [client.wait(job.id, timeout=args.timeout)]
        else:
            submitted = client.submit_many(
                args.model,
                split_samples(inputs, args.input),
                version=args.version,
                priority=args.priority,
                progress=None,
                cancel_after=args.cancel_after,
                queue_timeout=args.queue_timeout,
                webhook=args.webhook,
                webhook_events=webhook_events,
            )
            if not (args.wait or output):
                print("\n".join(job.id for job in submitted))
                return 0
            jobs = client.wait_all([job.id for job in submitted], timeout=args.timeout)
    failed = [job for job in jobs if not job.ok]
    for job in failed:
        error = f"{job.error.code}: {job.error.message}" if job.error else job.status
        print(f"tffleet: job {job.id} {job.status}: {error}", file=sys.stderr)
    if output is None:
        _print_jobs(jobs)
    elif not failed:
        _save(output, jobs)
        print(f"tffleet: saved the outputs of {len(jobs)} job(s) to {output}", file=sys.stderr)
    return 1 if failed else 0


def _status(args: argparse.Namespace) -> int:
    from tffleet.client.sync import Client

    if args.follow and len(args.job_ids) > 1:
        raise UsageError("--follow follows one job")
    with Client(args.url) as client:
        if args.follow:
            last = None
            for last in client.events(args.job_ids[0]):
                _print_jobs([last])
            return 0 if last is not None and last.ok else 1
        if args.wait:
            jobs = client.wait_all(args.job_ids, timeout=args.wait)
        else:
            jobs = client.get_many(args.job_ids)
    _print_jobs(jobs)
    return 0


def _retry(args: argparse.Namespace) -> int:
    from tffleet.client.sync import Client

    with Client(args.url) as client:
        job = client.retry(
            args.job_id, cancel_after=args.cancel_after, queue_timeout=args.queue_timeout
        )
    _print_jobs([job])
    return 0


def _delete(args: argparse.Namespace) -> int:
    from tffleet.client.sync import Client

    with Client(args.url) as client:
        client.delete(args.job_id)
    print(f"tffleet: deleted job {args.job_id}", file=sys.stderr)
    return 0


def webhook_events_of(given: str | None) -> list[str] | None:
    """`--webhook-events start,completed` as a list; the API refuses an unknown event."""
    if given is None:
        return None
    events = [event.strip() for event in given.split(",") if event.strip()]
    if not events:
        raise UsageError("--webhook-events: expected start, completed or start,completed")
    return events


def read_inputs(source: str) -> Any:
    """The `inputs` of a job from a .npy, .npz or JSON file, or JSON on stdin (`-`)."""
    import zipfile

    import numpy as np
    import orjson

    if source == "-":
        try:
            return orjson.loads(sys.stdin.buffer.read())
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"stdin: not valid JSON ({exc})") from None
    path = Path(source)
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".npz", ".json"):
        raise UsageError(f"{source}: expected a .npy, .npz or .json file, or - for JSON on stdin")
    if not path.exists():
        raise UsageError(f"{source}: no such file")
    try:
        if suffix == ".json":
            return orjson.loads(path.read_bytes())
        if suffix == ".npy":
            return np.load(path, allow_pickle=False)
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except OSError as exc:
        raise UsageError(f"{source}: {exc.strerror or exc}") from None
    except (ValueError, EOFError, zipfile.BadZipFile) as exc:  # includes orjson's JSONDecodeError
        raise UsageError(f"{source}: not a valid {suffix} file ({exc})") from None


def split_samples(inputs: Any, source: str) -> list[Any]:
    """One job's inputs per sample: every tensor cut along its first (batch) dimension."""
    import numpy as np

    from tffleet import tensors

    def batch(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == _ENVELOPE:
            try:
                return tensors.decode(value, dtype=value["dtype"])
            except (tensors.TensorError, KeyError) as exc:
                raise UsageError(f"{source}: not a valid tensor ({exc})") from None
        if isinstance(value, np.ndarray | list) and np.ndim(value) >= 1:
            return value
        raise UsageError(f"{source}: --split needs tensors with a batch dimension")

    if isinstance(inputs, dict) and set(inputs) != _ENVELOPE:
        named = {name: batch(value) for name, value in inputs.items()}
        sizes = {len(value) for value in named.values()}
        if len(sizes) > 1:
            raise UsageError(f"{source}: --split needs inputs of one batch size, got {sizes}")
        n = sizes.pop() if sizes else 0
        samples: list[Any] = [{k: v[i : i + 1] for k, v in named.items()} for i in range(n)]
    else:
        whole = batch(inputs)
        samples = [whole[i : i + 1] for i in range(len(whole))]
    if not samples:
        raise UsageError(f"{source}: the batch is empty; nothing to submit")
    return samples


def _print_jobs(jobs: list[Job]) -> None:
    import orjson

    for job in jobs:
        print(orjson.dumps(job.to_dict()).decode(), flush=True)


def _save(output: Path, jobs: list[Job]) -> None:
    """One job's outputs as they are; many jobs' (from --split) joined back into one batch."""
    import numpy as np

    outputs = [job.outputs or {} for job in jobs]
    arrays: dict[str, Any] = (
        outputs[0]
        if len(outputs) == 1
        else {name: np.concatenate([out[name] for out in outputs]) for name in outputs[0]}
    )
    try:
        np.savez(output, **arrays)
    except OSError as exc:
        raise UsageError(f"{output}: {exc.strerror or exc}") from None
