"""Run a module under cProfile, its stats written when SIGTERM stops it:

    python -m bench.profiled OUT.prof tffleet.cli api --log-level warning

`python -m cProfile` writes nothing for a server stopped by SIGTERM: uvicorn restores the
handler it found and raises the signal again once it has shut down, and the default handler
ends the process there. Here that handler exits the interpreter instead, so the profile is
written. cProfile sees the thread it started in only (an API's event loop, not its threads).
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys


def main() -> None:
    out, module, *args = sys.argv[1:]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.argv = [module, *args]
    profiler = cProfile.Profile()
    try:
        profiler.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        profiler.dump_stats(out)


if __name__ == "__main__":
    main()
