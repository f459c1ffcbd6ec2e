"""CHANGELOG.md keeps the Keep a Changelog shape and lists every module that moved in 0.2.0."""

from __future__ import annotations

import re
from pathlib import Path

from gpunb._version import __version__
from gpunb.analysis import MOVED_MODULES

CHANGELOG = (Path(__file__).resolve().parents[1] / "CHANGELOG.md").read_text(encoding="utf-8")


def test_every_moved_module_is_in_the_changelog_with_its_new_path():
    missing = [f"{old} -> {new}" for old, new in MOVED_MODULES.items()
               if f"| `gpunb.analysis.{old}` | `gpunb.analysis.{new}` |" not in CHANGELOG]
    assert not missing, f"CHANGELOG.md's table of moved modules lacks {missing} (MOVED_MODULES)"


def test_the_changelog_has_an_unreleased_section_and_this_version_dated():
    versions = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", CHANGELOG, re.M)
    assert versions[0] == ("Unreleased", ""), "the first section is [Unreleased], where the next changes go"
    assert (__version__, versions[1][1]) == versions[1] and versions[1][1], (
        f"the newest release section is gpunb {__version__} (gpunb/_version.py), with its date")
