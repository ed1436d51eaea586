"""The transforms tutorial (docs/tutorial-transforms.md), run as a newcomer runs it: every ```bash
and ```python block in order, pasted into a second terminal while `make run` goes on in the
first, against a `tffleet up` of its own (tests/docs/test_tutorial.py's `up`, with no TFFLEET_*
setting: no TFFLEET_TRANSFORM_LOCATIONS, so its datasets go through `tffleet datasets put`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.test_tutorial import (
    BLOCK_TIMEOUT_S,
    UP_TIMEOUT_S,
    Up,
    blocks,
    run_every_block,
    up,  # noqa: F401  (the fixture, used by name)
)

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial-transforms.md"


def test_it_starts_with_make_run_runs_every_other_block_and_never_sleeps() -> None:
    shown = blocks(TUTORIAL.read_text())
    assert shown and shown[0].code.strip() == "make run" and not shown[0].run
    assert [str(block) for block in shown[1:] if not block.run] == []
    assert not [str(b) for b in shown if "sleep" in b.code]


@pytest.mark.slow
@pytest.mark.timeout(UP_TIMEOUT_S + 10 * BLOCK_TIMEOUT_S)
def test_every_block_runs_against_a_live_tffleet_up(up: Up) -> None:  # noqa: F811
    run_every_block(TUTORIAL, up)
