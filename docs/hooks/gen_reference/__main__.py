"""`python -m gen_reference [DIR]`: the pages as JSON on stdout, or written under DIR."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gen_reference import pages

if __name__ == "__main__":
    found = pages()
    if len(sys.argv) > 1:
        for path, content in found.items():
            target = Path(sys.argv[1]) / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
    else:
        json.dump(found, sys.stdout)
