"""MkDocs hook: the reference pages, generated from the code at every build (gen_reference/).

The generator runs in a process of its own, so that `mkdocs serve` shows the code as it is now
(not as it was when the server started), the pages do not depend on the `TFFLEET_*` variables of
whoever builds them, and the metrics' registry of this process stays empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

HERE = Path(__file__).resolve().parent
# The variables that would change what the generator sees: our settings, prometheus_client's
# multiprocess mode, and the terminal width that argparse wraps its usage lines to.
_CLEARED = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir", "COLUMNS")


def generate(root: Path) -> dict[str, str]:
    """{path under docs/: Markdown} of every generated page."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TFFLEET_") and k not in _CLEARED
    }
    env["COLUMNS"] = "100"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), str(root), env.get("PYTHONPATH", "")) if p
    )
    done = subprocess.run(
        [sys.executable, "-m", "gen_reference"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise PluginError(f"the reference pages could not be generated:\n{done.stderr.strip()}")
    pages: dict[str, str] = json.loads(done.stdout)
    return pages


def on_files(files: Files, config: Any) -> Files:
    root = Path(config["config_file_path"]).resolve().parent
    for path, content in generate(root).items():
        if files.get_file_from_path(path) is not None:
            raise PluginError(
                f"docs/{path} is generated from the code at build time: remove the file"
            )
        files.append(File.generated(config, path, content=content))
    return files
