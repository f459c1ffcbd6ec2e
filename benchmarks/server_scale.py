"""The server extension on a busy shared node: a GPU with thousands of processes (MPS, many
users). Targets (issue 21): the holders report for 3,000 GPU processes built in under 1 s, and
Jupyter's own endpoints never stalled by gpunb by more than 100 ms.

Everything stays on this machine: ``--processes`` sleeping processes stand in for the GPU's
processes (real PIDs, so ``/proc`` is read as on a real node), and gpunb's fake NVML lists them
(no GPU needed). Two parts:

1. **the report, in this process**: ``build_report`` over the fake GPU, first and second time,
   and the two answer bodies (JSON, metrics text) made from it;
2. **a real Jupyter server** (``127.0.0.1``, a random port, a random token, gpunb's extension,
   the same fake NVML): for ``--seconds``, 4 clients ask ``/gpunb/api/gpus`` and
   ``/gpunb/metrics`` back to back while another process asks Jupyter's ``/api/status`` every
   20 ms and times each answer. Before the load, ``/api/status`` alone (2 s) gives the baseline.

    python benchmarks/server_scale.py [--processes 3000] [--seconds 10] [--out DIR]

Every process it starts (the sleepers, the server) is stopped at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_PROCESSES = 10_000

SERVER = """
import json, sys
from gpunb.readings import nvml
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import FakeGpu, FakePynvml, load_trace

trace = load_trace()
gpu = FakeGpu(facts=dict(trace["facts"]), samples=[dict(trace["samples"][0], processes=[])])
gpu.extra_processes = [{"pid": pid, "used_gpu_memory": 2**30} for pid in json.load(open(sys.argv[1]))]
nvml.set_default_session(NvmlSession(FakePynvml([gpu])))
from jupyter_server.serverapp import ServerApp
ServerApp.launch_instance(argv=sys.argv[2:])
"""


def _fake_session(pids: list[int]):
    from gpunb.readings.nvml import NvmlSession
    from gpunb.testing import FakeGpu, FakePynvml, load_trace

    trace = load_trace()
    gpu = FakeGpu(facts=dict(trace["facts"]), samples=[dict(trace["samples"][0], processes=[])])
    gpu.extra_processes = [{"pid": pid, "used_gpu_memory": 2**30} for pid in pids]
    return NvmlSession(FakePynvml([gpu]))


def part_report(pids: list[int]) -> dict[str, float]:
    from gpunb.analysis.holders.gpus import build_report
    from gpunb.views.metrics_view import metrics_text

    nvml = _fake_session(pids)
    out = {}
    for run in ("first", "second"):
        t0 = time.perf_counter()
        report = build_report(nvml, ())
        out[f"build_{run}_s"] = time.perf_counter() - t0
    assert len(report.holders()) == len(pids), "the fake GPU did not list every process"
    t0 = time.perf_counter()
    json.dumps(report.to_dict())
    out["json_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    metrics_text(report)
    out["metrics_s"] = time.perf_counter() - t0
    return out


POLLER = """
import json, sys, time, urllib.request
url, token, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
times, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    t0 = time.perf_counter()
    with opener.open(urllib.request.Request(url, headers={"Authorization": "token " + token}), timeout=30) as r:
        r.read()
    times.append(time.perf_counter() - t0)
    time.sleep(0.02)
json.dump(times, open(out, "w"))
"""


def _poll_status(url: str, token: str, seconds: float, out: Path) -> subprocess.Popen:
    """Jupyter's /api/status asked every 20 ms from a process of its own (the load clients'
    threads would otherwise delay the timing client too)."""
    return subprocess.Popen([sys.executable, "-c", POLLER, url, token, str(seconds), str(out)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, token: str, timeout: float = 30.0) -> tuple[int, float]:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    t0 = time.perf_counter()
    try:
        with opener.open(request, timeout=timeout) as r:
            r.read()
            code = r.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    return code, time.perf_counter() - t0


def _summary(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    if not ms:
        return {}
    return {"n": len(ms), "median_ms": statistics.median(ms), "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
            "max_ms": ms[-1]}


def part_server(pids: list[int], seconds: float, work: Path) -> dict[str, object]:
    (work / "pids.json").write_text(json.dumps(pids))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(work / "runtime"), JUPYTER_CONFIG_DIR=str(work / "config"),
               JUPYTER_DATA_DIR=str(work / "data"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("GPUNB_FAKE_NVML", None)
    (work / "root").mkdir()
    with open(work / "server.log", "w") as log:  # the child keeps its own copy of the descriptor
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(work / "pids.json"), "--ip=127.0.0.1", f"--port={port}",
             "--ServerApp.port_retries=0", "--allow-root", f"--IdentityProvider.token={token}",
             "--ServerApp.open_browser=False", f"--ServerApp.root_dir={work / 'root'}",
             "--ServerApp.jpserver_extensions={'gpunb': True}"],
            env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(base + "api/status", token, 2.0)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                log = (work / "server.log").read_text()[-3000:]
                raise RuntimeError(f"the Jupyter server did not start:\n{log}")
            time.sleep(0.2)
        _poll_status(base + "api/status", token, 2.0, work / "alone.json").wait(60)
        baseline = json.loads((work / "alone.json").read_text())
        code, first = _get(base + "gpunb/api/gpus", token)
        stop = threading.Event()
        gpunb: dict[str, list[float]] = {"gpunb/api/gpus": [], "gpunb/metrics": []}
        errors: list[int] = []
        poller = _poll_status(base + "api/status", token, seconds, work / "loaded.json")

        def load(path: str) -> None:
            while not stop.is_set():
                c, t = _get(base + path, token)
                gpunb[path].append(t)
                if c != 200:
                    errors.append(c)

        threads = [threading.Thread(target=load, args=(p,)) for p in ("gpunb/api/gpus", "gpunb/metrics") * 2]
        for t in threads:
            t.start()
        poller.wait(seconds + 60)
        stop.set()
        for t in threads:
            t.join(60)
        status = json.loads((work / "loaded.json").read_text())
        return {"first_gpus_code": code, "first_gpus_s": first, "status_alone": _summary(baseline),
                "status_under_load": _summary(status),
                **{path: _summary(times) for path, times in gpunb.items()}, "errors": errors[:10]}
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not 1 <= args.processes <= MAX_PROCESSES:
        ap.error(f"--processes must be between 1 and {MAX_PROCESSES}")
    sys.path.insert(0, str(ROOT))
    sleepers: list[subprocess.Popen] = []
    work = Path(tempfile.mkdtemp(prefix="gpunb-server-scale-"))
    try:
        for _ in range(args.processes):
            sleepers.append(subprocess.Popen(["sleep", "3600"]))
        pids = [p.pid for p in sleepers]
        result = {"processes": args.processes, "report": part_report(pids)}
        print(json.dumps(result["report"], indent=1))
        result["server"] = part_server(pids, args.seconds, work)
        print(json.dumps(result["server"], indent=1))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "server_scale.json").write_text(json.dumps(result, indent=1))
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
