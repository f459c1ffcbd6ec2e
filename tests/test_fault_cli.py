"""``gpunb check`` at its edges: exit 2 under ``--json`` still prints JSON on stdout, and a
report that cannot be written (stdout on a full device) is one line on stderr, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = dict(os.environ, GPUNB_FAKE_NVML="h200")


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpunb", "check", *args], text=True, env=ENV, timeout=120, **kw)


@pytest.mark.parametrize("args", [("--device", "3"), ("--bogus",), ("--quick", "--deep")])
def test_exit_2_under_json_prints_json_on_stdout(args):
    done = cli("--json", *args, capture_output=True)
    assert done.returncode == 2, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["error"]["type"] == "usage" and report["error"]["message"]
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [("--quick",), ("--quick", "--json"), ("--json", "--bogus")])
def test_stdout_on_a_full_device_is_one_line_not_a_traceback(args):
    with open("/dev/full", "w") as full:
        done = cli(*args, stdout=full, stderr=subprocess.PIPE)
    assert done.returncode == 4, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "No space left on device" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
