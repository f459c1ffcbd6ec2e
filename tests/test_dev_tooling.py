"""CI runs what the README tells developers to run, with the static checkers pinned."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_dev_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set up and test (developers)", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the developer section has no bash block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readme_commands_verbatim_and_in_order():
    commands = _readme_dev_commands()
    assert any("ruff check" in c for c in commands) and any("mypy" in c for c in commands)
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    positions = [ci.index(c) for c in commands]  # ValueError names a command CI does not run
    assert positions == sorted(positions), "CI runs the README's commands in another order"


def test_the_static_checkers_are_pinned_in_the_test_extra():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    test_extra = project["project"]["optional-dependencies"]["test"]
    for tool in ("ruff", "mypy"):
        pins = [r for r in test_extra if re.match(rf"{tool}\s*==", r)]
        assert pins, f"{tool} is not pinned with == in the test extra: a new release could fail CI by itself"
