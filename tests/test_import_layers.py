"""The layer rules of docs/architecture.md, held by a checker that reads every module's imports
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
    # the OOM hook imports the doctor lazily (inside a function): the checker sees it
    assert ("gpunb.shells.oom_hook", "gpunb.analysis.memory.oom") in lazy
    assert any(i.source.startswith("gpunb.shells.") and i.target.startswith("IPython") for i in shell)
    # and no analysis module imports a view, not even inside a function
    assert not [i for i in found if i.source.startswith("gpunb.analysis.") and i.target.startswith("gpunb.views")]


def test_every_record_is_shown_by_a_registered_view():
    from gpunb import display
    from gpunb.analysis.checks.records import CheckReport, CheckResult
    from gpunb.analysis.fit.records import BatchFit
    from gpunb.analysis.memory.oom_records import OomDiagnosis
    from gpunb.analysis.memory.records import MemoryReport
    from gpunb.analysis.profile.records import CellProfile, HistoryReport
    from gpunb.analysis.ranks.records import RanksPart

    for record in (CheckReport, CheckResult, BatchFit, OomDiagnosis, MemoryReport, CellProfile, HistoryReport,
                   RanksPart):
        views = display._lookup(display._VIEWS, record)
        assert views is not None and "text/plain" in views and "text/html" in views, record.__name__


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name in ("", "readings", "analysis", "analysis/checks", "analysis/memory", "analysis/fit", "views",
                 "shells"):
        (pkg / name).mkdir(parents=True, exist_ok=True)
        (pkg / name / "__init__.py").write_text("")
    for rel, source in files.items():
        (pkg / rel).write_text(textwrap.dedent(source))
    return pkg


CLEAN = {
    "display.py": "class DisplayMixin:\n    pass\n",
    "readings/nvml.py": "import os\n",
    "analysis/advice.py": "import os\n",
    "analysis/torch_wheels.py": "import os\n",
    "analysis/gpu_specs.py": "import os\n",
    "analysis/memory/record.py": """
        from pkg.display import DisplayMixin
        from pkg.readings import nvml
        from pkg.analysis import advice

        class Report(DisplayMixin):
            pass
        """,
    "analysis/fit/search.py": "from pkg.analysis.memory import record\n",  # fit may use memory
    "views/report_view.py": """
        from pkg.analysis.memory.record import Report
        from pkg.display import register_views

        def text(r: Report) -> str:
            return "report"

        register_views(Report, {"text/plain": text})
        """,
    "shells/magic.py": """
        from IPython import get_ipython
        from ..analysis.memory.record import Report
        from . import api
        """,
    "shells/api.py": "from pkg.views import report_view\n",
}


def test_a_package_that_keeps_the_rules_passes(tmp_path):
    assert violations(_package(tmp_path, CLEAN), "pkg") == []


@pytest.mark.parametrize("rel, source, expected", [
    # a cycle hidden by a lazy import (the old profile <-> verdict)
    ("analysis/checks/verdict.py", "", None),
    # readings importing analysis at module level
    ("readings/gpu.py", "from pkg.analysis.memory.record import Report\n",
     "pkg.readings.gpu:1 imports pkg.analysis.memory.record at module level"),
    # a record reaching its view from its own method: no longer allowed
    ("analysis/memory/other.py", "from pkg.display import DisplayMixin\nclass Other(DisplayMixin):\n"
     "    def _repr_views_(self):\n        from pkg.views import report_view\n",
     "pkg.analysis.memory.other:4 imports pkg.views.report_view in _repr_views_()"),
    # a capability using one the allowed graph does not give it (memory -> fit)
    ("analysis/memory/oom.py", "def quote():\n    from pkg.analysis.fit import search\n",
     "pkg.analysis.memory.oom:2 imports pkg.analysis.fit.search in quote() (capability 'memory' may not use 'fit')"),
    # a shared module using a capability
    ("analysis/gpu_specs.py", "from pkg.analysis.checks import gpu\n",
     "pkg.analysis.gpu_specs:1 imports pkg.analysis.checks at module level (a shared module may not use "
     "'checks')"),
    # analysis reaching into views from a plain function
    ("analysis/torch_wheels.py", "def show():\n    from pkg.views import report_view\n",
     "pkg.analysis.torch_wheels:2 imports pkg.views.report_view in show()"),
    # a relative import from views up to shells
    ("views/table.py", "from ..shells import magic\n", "pkg.views.table:1 imports pkg.shells.magic at module level"),
    # a foundation module importing a layer
    ("units.py", "import pkg.readings.nvml\n", "pkg.units:1 imports pkg.readings.nvml at module level"),
    # type-only imports still count for direction
    ("readings/host.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.views import report_view\n",
     "pkg.readings.host:3 imports pkg.views.report_view at module level"),
    # analysis finding the shell itself, by import or through sys.modules
    ("analysis/memory/show.py", "def show(report):\n    from IPython.display import display\n    display(report)\n",
     "pkg.analysis.memory.show:2 imports IPython.display.display in show() (only the shells layer talks to IPython)"),
    ("analysis/checks/kernel.py",
     "import sys\ndef in_kernel():\n    return sys.modules['IPython'].get_ipython() is not None\n",
     "pkg.analysis.checks.kernel:3 imports IPython.get_ipython in in_kernel() (only the shells layer talks to "
     "IPython)"),
    ("views/widget.py", "import ipywidgets\n",
     "pkg.views.widget:1 imports ipywidgets at module level (only the shells layer talks to IPython)"),
])
def test_a_planted_violation_is_found(tmp_path, rel, source, expected):
    files = dict(CLEAN)
    if rel == "analysis/checks/verdict.py":  # report imports verdict at module level, verdict imports it lazily
        files["analysis/checks/report.py"] = "from pkg.analysis.checks import verdict\n"
        files[rel] = "def judge(p):\n    from pkg.analysis.checks import report\n"
        expected = "import cycle: pkg.analysis.checks.report <-> pkg.analysis.checks.verdict"
    else:
        files[rel] = source
    assert violations(_package(tmp_path, files), "pkg") == [expected]


def test_a_view_importing_its_record_at_run_time_closes_a_cycle(tmp_path):
    files = dict(CLEAN)
    files["analysis/memory/record.py"] = "def show(r):\n    from pkg.views import report_view\n"
    expected = ["import cycle: pkg.analysis.memory.record <-> pkg.views.report_view",
                "pkg.analysis.memory.record:2 imports pkg.views.report_view in show()"]
    assert violations(_package(tmp_path, files), "pkg") == expected


def test_a_module_loose_in_analysis_is_named(tmp_path):
    files = dict(CLEAN)
    files["analysis/loose.py"] = "import os\n"
    with pytest.raises(ValueError, match=r"pkg\.analysis\.loose is in no capability"):
        violations(_package(tmp_path, files), "pkg")


def test_a_module_outside_every_layer_is_named(tmp_path):
    files = dict(CLEAN)
    files["helpers.py"] = "import os\n"
    with pytest.raises(ValueError, match=r"pkg\.helpers belongs to no layer"):
        violations(_package(tmp_path, files), "pkg")
