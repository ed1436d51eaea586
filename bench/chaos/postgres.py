"""A PostgreSQL server of the chaos run's own, which it may restart without disturbing anyone.

The machine's cluster serves other tests and other people: the run starts a private one instead,
the fault tests' (tests/services.py `PrivatePostgres`: `initdb` and `pg_ctl` from the server
package, on a free loopback port, as the `postgres` user when root), restarts that, and removes
it at the end. Where it cannot be made, `private_postgres` yields None and the run uses the test
server, without the restart fault.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.services import PrivatePostgres, postgres_bin
from tffleet.cli.process_group import free_port


class RestartablePostgres(PrivatePostgres):
    def restart(self) -> None:
        """A fast restart: every connection is cut, the server is back a moment later."""
        self.stop("fast")
        self.start()


@contextlib.contextmanager
def private_postgres() -> Iterator[RestartablePostgres | None]:
    bindir = postgres_bin()
    if bindir is None:
        yield None
        return
    root = Path(tempfile.mkdtemp(prefix="tffleet-chaos-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, user="postgres")
    server = RestartablePostgres(bin=bindir, root=root, port=free_port())
    try:
        server.init()
        server.start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"no private PostgreSQL ({exc}): the test server, and no restart")
        shutil.rmtree(root, ignore_errors=True)
        yield None
        return
    try:
        yield server
    finally:
        with contextlib.suppress(RuntimeError):
            server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
