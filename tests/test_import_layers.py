"""The layer rules of README "Design", held by a checker that reads every module's imports
(module level and inside functions) with ``ast``; the checker itself is tested on a small
package with planted violations, so this test can fail."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import gpunb
from tests.import_rules import imports, violations


def test_gpunb_has_no_import_cycle_no_upward_import_and_no_shell_below_the_shells():
    assert violations(Path(gpunb.__file__).parent, "gpunb") == []


def test_the_checker_sees_the_imports_that_hide_inside_functions():
    found, shell = imports(Path(gpunb.__file__).parent, "gpunb")
    lazy = {(i.source, i.target) for i in found if i.function}
    # profile's record is shown by the view it imports lazily, from a method of the record
    assert ("gpunb.analysis.profile_records", "gpunb.views.profile_view") in lazy
    assert any(i.source.startswith("gpunb.shells.") and i.target.startswith("IPython") for i in shell)


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name in ("", "readings", "analysis", "views", "shells"):
        (pkg / name).mkdir(parents=True, exist_ok=True)
        (pkg / name / "__init__.py").write_text("")
    for rel, source in files.items():
        (pkg / rel).write_text(textwrap.dedent(source))
    return pkg


CLEAN = {
    "display.py": "class DisplayMixin:\n    pass\n",
    "readings/nvml.py": "import os\n",
    "analysis/record.py": """
        from pkg.display import DisplayMixin
        from pkg.readings import nvml

        class Report(DisplayMixin):
            def _repr_views_(self):
                from pkg.views.report_view import text  # the written rule
                return {"text/plain": text}
        """,
    "views/report_view.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:  # names the record type; never runs
            from pkg.analysis.record import Report

        def text(r: "Report") -> str:
            return "report"
        """,
    "shells/magic.py": """
        from IPython import get_ipython
        from ..analysis.record import Report
        from . import api
        """,
    "shells/api.py": "from pkg.views import report_view\n",
}


def test_a_package_that_keeps_the_rules_passes(tmp_path):
    assert violations(_package(tmp_path, CLEAN), "pkg") == []


@pytest.mark.parametrize("rel, source, expected", [
    # a cycle hidden by a lazy import (the old profile <-> verdict)
    ("analysis/verdict.py", "from pkg.analysis import profile\n", None),
    # readings importing analysis at module level
    ("readings/gpu.py", "from pkg.analysis.record import Report\n",
     "pkg.readings.gpu:1 imports pkg.analysis.record at module level"),
    # analysis reaching into views from a plain function
    ("analysis/advice.py", "def show():\n    from pkg.views import report_view\n",
     "pkg.analysis.advice:2 imports pkg.views.report_view in show()"),
    # a method of a class that is not a record does not get the exception
    ("analysis/session.py", "class Session:\n    def _repr_views_(self):\n        import pkg.views.report_view\n",
     "pkg.analysis.session:3 imports pkg.views.report_view in _repr_views_()"),
    # a record may not import its view at module level
    ("analysis/other.py", "from pkg.display import DisplayMixin\nfrom pkg.views import report_view\n"
     "class Other(DisplayMixin):\n    pass\n",
     "pkg.analysis.other:2 imports pkg.views.report_view at module level"),
    # a relative import from views up to shells
    ("views/table.py", "from ..shells import magic\n", "pkg.views.table:1 imports pkg.shells.magic at module level"),
    # a foundation module importing a layer
    ("units.py", "import pkg.readings.nvml\n", "pkg.units:1 imports pkg.readings.nvml at module level"),
    # type-only imports still count for direction
    ("readings/host.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.views import report_view\n",
     "pkg.readings.host:3 imports pkg.views.report_view at module level"),
    # analysis finding the shell itself, by import or through sys.modules
    ("analysis/memory.py", "def show(report):\n    from IPython.display import display\n    display(report)\n",
     "pkg.analysis.memory:2 imports IPython.display.display in show() (only the shells layer talks to IPython)"),
    ("analysis/checks.py",
     "import sys\ndef in_kernel():\n    return sys.modules['IPython'].get_ipython() is not None\n",
     "pkg.analysis.checks:3 imports IPython.get_ipython in in_kernel() (only the shells layer talks to IPython)"),
    ("views/widget.py", "import ipywidgets\n",
     "pkg.views.widget:1 imports ipywidgets at module level (only the shells layer talks to IPython)"),
])
def test_a_planted_violation_is_found(tmp_path, rel, source, expected):
    files = dict(CLEAN)
    if rel == "analysis/verdict.py":  # profile imports verdict at module level, verdict imports profile lazily
        files["analysis/profile.py"] = "from pkg.analysis import verdict\n"
        files[rel] = "def judge(p):\n    from pkg.analysis import profile\n"
        expected = "import cycle: pkg.analysis.profile <-> pkg.analysis.verdict"
    else:
        files[rel] = source
    assert violations(_package(tmp_path, files), "pkg") == [expected]


def test_a_view_importing_its_record_at_run_time_closes_a_cycle(tmp_path):
    files = dict(CLEAN)
    files["views/report_view.py"] = "from pkg.analysis.record import Report\n"
    expected = ["import cycle: pkg.analysis.record <-> pkg.views.report_view"]
    assert violations(_package(tmp_path, files), "pkg") == expected


def test_a_module_outside_every_layer_is_named(tmp_path):
    files = dict(CLEAN)
    files["helpers.py"] = "import os\n"
    with pytest.raises(ValueError, match=r"pkg\.helpers belongs to no layer"):
        violations(_package(tmp_path, files), "pkg")
