"""docs/security.md is a list of promises, each backed by a named test: every numbered promise
names at least one ``tests/<file>.py::<test>``, and every test it names exists (found with
``ast``, nothing is imported). A promise whose test is renamed or removed fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "security.md"
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _promises() -> list[str]:
    """The numbered items under "## Promises", each with its continuation lines."""
    text = DOC.read_text()
    section = text[text.index("## Promises"):]
    section = section[:section.index("\n## ", 1)]
    return [m.group(0) for m in re.finditer(r"(?ms)^\d+\. .*?(?=^\d+\. |^### |\Z)", section)]


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def test_every_promise_names_a_test_and_every_named_test_exists():
    promises = _promises()
    assert len(promises) >= 20
    missing, unbacked = [], []
    for promise in promises:
        named = NAMED.findall(promise)
        if not named or "Test:" not in promise:
            unbacked.append(promise.split("\n")[0][:80])
        for file, test in named:
            path = ROOT / file
            if not path.is_file() or test not in _tests_in(path):
                missing.append(f"{file}::{test}")
    assert not unbacked, f"promises without a named test: {unbacked}"
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"


def test_the_page_does_not_claim_the_shutdown_spares_busy_kernels():
    """Issue 31: the page said "acts only on idle kernels" while ``force`` shuts busy ones down."""
    text = DOC.read_text()
    assert "only on this server's idle kernels" not in text and "acts only on idle" not in text
    assert "with `force`,\n    it shuts down a busy kernel" in text
