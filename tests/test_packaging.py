"""What ``pip install`` puts in place: the wheel enables the Jupyter server extension."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import gpunb

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "etc/jupyter/jupyter_server_config.d/gpunb.json"


def test_the_wheel_installs_the_server_extension_config(tmp_path):
    pytest.importorskip("hatchling", reason="the test extra installs hatchling to build the wheel offline")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next(tmp_path.glob("gpunb-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert f"gpunb-{gpunb.__version__}.data/data/{CONFIG}" in names
        assert json.loads(z.read(f"gpunb-{gpunb.__version__}.data/data/{CONFIG}")) == {
            "ServerApp": {"jpserver_extensions": {"gpunb": True}}}
        assert "gpunb/shells/server_extension.py" in names
        # what the multi-GPU parts run or replay: the rank scripts, the workers' start-up hook, the recorded pair
        for shipped in ("gpunb/readings/allreduce_script.py", "gpunb/analysis/ranks/boot/sitecustomize.py",
                        "gpunb/testing/h200x2_nvlink.json"):
            assert shipped in names, shipped
        metadata = z.read(f"gpunb-{gpunb.__version__}.dist-info/METADATA").decode()
    assert "Requires-Dist: prometheus-client" in metadata or "Requires-Dist: prometheus_client" in metadata
    # the file in the repository is the one shipped
    assert json.loads((ROOT / "jupyter-config/jupyter_server_config.d/gpunb.json").read_text()) == {
        "ServerApp": {"jpserver_extensions": {"gpunb": True}}}


def test_the_extension_points_name_a_module_that_loads_without_torch():
    points = gpunb._jupyter_server_extension_points()
    assert points == [{"module": "gpunb.shells.server_extension"}]
    code = ("import sys, importlib; m = importlib.import_module('gpunb.shells.server_extension'); "
            "assert callable(m._load_jupyter_server_extension); "
            "print(','.join(x for x in ('torch', 'pynvml', 'matplotlib') if x in sys.modules) or 'none')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "none"


def test_a_release_is_one_command_away_a_wheel_and_an_sdist_that_pass_twine_check(tmp_path):
    """`python -m build --no-isolation` (offline: hatchling is a test dependency) makes the wheel
    and the sdist; `twine check` finds nothing PyPI would refuse or show badly."""
    pytest.importorskip("build", reason="the test extra installs build")
    pytest.importorskip("twine", reason="the test extra installs twine")
    pytest.importorskip("hatchling", reason="the test extra installs hatchling to build offline")
    made = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    wheel = next(tmp_path.glob(f"gpunb-{gpunb.__version__}-*.whl"))
    sdist = tmp_path / f"gpunb-{gpunb.__version__}.tar.gz"
    assert sdist.is_file()
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                             capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout
    with zipfile.ZipFile(wheel) as z:  # what opening the tutorials needs comes with the extra, never torch
        metadata = z.read(f"gpunb-{gpunb.__version__}.dist-info/METADATA").decode()
    extra = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "tutorials" in line]
    assert any("jupyterlab" in line for line in extra), extra
    assert not any(name in line for line in extra for name in ("torch", "accelerate"))
