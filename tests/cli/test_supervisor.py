"""`tffleet up`'s supervisor: a process that exits is started again, with a back-off."""

from __future__ import annotations

import io
import sys

from tffleet.cli.process_group import ProcessGroup
from tffleet.cli.supervisor import STABLE_AFTER_S, Supervisor


def test_an_exited_process_is_started_again_after_a_doubling_back_off_reset_once_it_stayed_up() -> (
    None
):
    group = ProcessGroup(stop_timeout_s=5)
    now = [0.0]
    out = io.StringIO()
    supervisor = Supervisor(group, clock=lambda: now[0], out=out)
    try:
        group.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
        first = group.start("quitter", [sys.executable, "-c", "raise SystemExit(3)"])
        first.wait(timeout=30)
        supervisor.step()
        assert "quitter (pid" in out.getvalue()
        assert "exited with status 3; starting it again in 1 s" in out.getvalue()

        now[0] = 0.5  # still backing off
        supervisor.step()
        assert dict(group.started)["quitter"] is first

        now[0] = 1.0
        supervisor.step()
        second = dict(group.started)["quitter"]
        assert second is not first
        assert [name for name, _ in group.started] == ["sleeper", "quitter"]  # stop order kept
        assert f"quitter started again (pid {second.pid})" in out.getvalue()

        second.wait(timeout=30)  # a quick second exit waits twice as long
        supervisor.step()
        assert "starting it again in 2 s" in out.getvalue()
        now[0] = 3.0
        supervisor.step()
        third = dict(group.started)["quitter"]
        assert third is not second

        third.wait(timeout=30)  # after a minute up, the back-off starts over
        now[0] = 3.0 + STABLE_AFTER_S
        supervisor.step()
        assert out.getvalue().rstrip().endswith("starting it again in 1 s")
        assert dict(group.started)["sleeper"].poll() is None  # the others never stopped
    finally:
        group.stop()
