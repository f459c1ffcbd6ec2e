"""CI runs what CONTRIBUTING.md and the README tell developers to run, with the static checkers pinned."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dev_commands(doc: str, heading: str) -> list[str]:
    """The commands of the first bash block under ``heading`` in ``doc`` (comments cut off)."""
    text = (ROOT / doc).read_text()
    assert f"\n{heading}\n" in text, f"{doc} has no section {heading!r}"
    section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"{doc}'s {heading!r} section has no bash block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def _ci_runs_in_order(commands: list[str]) -> None:
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    positions = [ci.index(c) for c in commands]  # ValueError names a command CI does not run
    assert positions == sorted(positions), "CI runs the documented commands in another order"


def test_ci_runs_the_contributing_commands_verbatim_and_in_order():
    commands = _dev_commands("CONTRIBUTING.md", "## Set up and test")
    assert any("ruff check" in c for c in commands) and any("mypy" in c for c in commands)
    _ci_runs_in_order(commands)


def test_the_readme_keeps_the_set_up_and_test_commands_near_the_top():
    commands = _dev_commands("README.md", "## Develop")
    assert commands[0] == "bash scripts/setup-dev.sh", "the README's first developer command sets everything up"
    assert any(c.startswith(".venv/bin/python -m pytest") for c in commands), "and one runs the tests"
    _ci_runs_in_order(commands)
    assert commands == [c for c in _dev_commands("CONTRIBUTING.md", "## Set up and test") if c in commands]
    readme = (ROOT / "README.md").read_text()
    assert readme[:readme.index("\n## Develop\n")].count("\n") < 80, "the developer commands stay near the top"
    assert "CONTRIBUTING.md" in readme.split("\n## Develop\n", 1)[1].split("\n## ", 1)[0]


def test_the_static_checkers_are_pinned_in_the_test_extra():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    test_extra = project["project"]["optional-dependencies"]["test"]
    for tool in ("ruff", "mypy"):
        pins = [r for r in test_extra if re.match(rf"{tool}\s*==", r)]
        assert pins, f"{tool} is not pinned with == in the test extra: a new release could fail CI by itself"


def _pinned(tool: str) -> str:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = [r for r in project["project"]["optional-dependencies"]["test"] if re.match(rf"{tool}\s*==", r)]
    assert pins, f"{tool} is not pinned with == in the test extra"
    return pins[0].split("==", 1)[1].strip()


def _pre_commit_repos() -> list[dict]:
    yaml = pytest.importorskip("yaml")  # comes with jupyter; the test reads the file, it installs nothing
    return yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]


def test_the_pre_commit_ruff_is_the_version_ci_pins():
    ruff = [r for r in _pre_commit_repos() if r["repo"].endswith("/ruff-pre-commit")]
    assert len(ruff) == 1, "one ruff-pre-commit repo in .pre-commit-config.yaml"
    assert ruff[0]["rev"] == f"v{_pinned('ruff')}", (
        f"pre-commit runs ruff {ruff[0]['rev']}, CI runs ruff=={_pinned('ruff')} (pyproject.toml): change both")
    hook = ruff[0]["hooks"][0]
    assert hook["id"] == "ruff-check" and not hook.get("args"), "the hook checks as CI does: no --fix, no options"
    assert "jupyter" in hook["types_or"], "CI's `ruff check .` reads the tutorial notebooks too"


def test_the_pre_commit_mypy_runs_as_ci_runs_it():
    hooks = [h for r in _pre_commit_repos() if r["repo"] == "local" for h in r["hooks"] if h["id"] == "mypy"]
    assert len(hooks) == 1, "a local mypy hook"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert hooks[0]["entry"] in ci, "the hook's command is the one .ci/run runs"
    assert hooks[0]["language"] == "system" and hooks[0]["pass_filenames"] is False, (
        "mypy checks the files pyproject.toml names, in the dev venv (torch and IPython types), as CI does")
