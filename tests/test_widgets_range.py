"""ipywidgets outside the supported range (7.8.5; pyproject declares >=8.1): no widget is
made, no comm opened, no controls subshell started; the reason is said once, with the fix.
Proved against a real ipywidgets 7.8.5 put first on the path of a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpunb.shells.monitor_controls import WIDGETS_MIN, _version_tuple

PROBE = """
import sys, types
import ipywidgets
from gpunb.shells import widget_channel
from gpunb.shells.monitor_controls import widgets_available
from gpunb.shells.cancel_button import CancelButton
started = []
widget_channel.controls_subshell = lambda kernel: started.append(kernel)
shell = types.SimpleNamespace(kernel=object())
assert widgets_available() is False and widgets_available() is False
assert CancelButton.shown("the check", shell) is None
registry = getattr(ipywidgets.Widget, "widgets", None) or getattr(ipywidgets.Widget, "_active_widgets", {})
print("version", ipywidgets.__version__, "widgets", len(registry), "subshells", len(started))
"""


def _old_widgets(tmp_path_factory) -> Path:
    target = Path(os.environ.get("GPUNB_TEST_W7", "/tmp/w7"))
    if not (target / "ipywidgets").is_dir() or not (target / "ipython_genutils").is_dir():
        target = tmp_path_factory.mktemp("w7")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target),
                               "ipywidgets==7.8.5", "ipython_genutils", "--no-deps"], capture_output=True, timeout=120)
        if done.returncode != 0:
            pytest.skip("ipywidgets 7.8.5 could not be installed here")
    return target


def test_ipywidgets_7_opens_nothing_and_says_why_once(tmp_path_factory):
    target = _old_widgets(tmp_path_factory)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", os.getcwd())])}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "version 7.8.5 widgets 0 subshells 0" in done.stdout
    assert done.stderr.count("ipywidgets 7.8.5 is older than the 8.1") == 1
    assert "pip install -U 'ipywidgets>=8.1'" in done.stderr


def test_the_range_is_read_from_the_version_text():
    assert _version_tuple("7.8.5") < WIDGETS_MIN <= _version_tuple("8.1.0") < _version_tuple("8.10rc1")
