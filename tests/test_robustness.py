"""Issue 11's ten findings, each reproduced as it was reported: hostile objects, hung or
lying NVML, huge inputs, leaks. Every test here failed before its fix."""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import threading
import time

import pytest
from IPython.utils.capture import capture_output

from gpunb.analysis.memory.oom_message import parse_oom_message
from gpunb.analysis.monitor import sampler as sampler_module
from gpunb.analysis.monitor.sampler import THREAD_NAME, Sampler
from gpunb.analysis.monitor.series import RingColumns
from gpunb.readings import nvml as nvml_module
from gpunb.readings.nvml import NvmlSession
from gpunb.testing import load_trace, scenario
from tests.hostile_objects import UNBOUND_PROXY
from tests.oom_cells import failing_oom_cell

MSG = load_trace()["oom_message"]
FOREVER = 30.0


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def install(fake) -> None:
    nvml_module.set_default_session(NvmlSession(fake))


@pytest.fixture
def fake():
    f = scenario("h200")
    install(f)
    yield f
    f.release_hangs()
    nvml_module.set_default_session(None)


@pytest.fixture
def fake2():
    f = scenario("second-gpu-lost")
    install(f)
    yield f
    nvml_module.set_default_session(None)


def run(ip, code: str):
    with capture_output() as out:
        result = ip.run_cell(code)
    text = out.stdout + out.stderr + "\n".join(o.data.get("text/plain", "") for o in out.outputs)
    return result, text


# -- 1. hostile objects in the namespace --------------------------------------------------

HOSTILE_DEFINITIONS = UNBOUND_PROXY + '''
class ItemsRaise(dict):
    def items(self):
        raise RuntimeError("items() refuses")

class IterRaise(list):
    def __iter__(self):
        raise RuntimeError("__iter__ refuses")

u = UnboundProxy(ContextVar("u"))
d = ItemsRaise(a=1)
l = IterRaise([1, 2])
'''

FAILING_CELL = failing_oom_cell(256, 1024)


@pytest.fixture
def oom_shell(ip):
    pytest.importorskip("torch")
    ip.reset(new_session=False)
    ip.user_ns["_gpunb_test"] = {"msg": MSG}
    yield ip
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)


def test_1_hostile_objects_do_not_stop_the_oom_doctor(oom_shell):
    ip = oom_shell
    run(ip, HOSTILE_DEFINITIONS)
    result, out = run(ip, FAILING_CELL)
    assert isinstance(result.error_in_exec, Exception) and "OutOfMemoryError" in type(result.error_in_exec).__name__
    assert "could not diagnose" not in out
    assert "gpunb OOM doctor" in out and "train_step() local acts" in out
    assert "3 names skipped" in out  # u, d and l could not be inspected: counted, not fatal
    gc.collect()
    assert ip.user_ns["_gpunb_test"]["ref"]() is None, "the failed cell's memory must still be released"
    result, out = run(ip, "%gpumem --all-devices")
    assert result.success, out
    assert "names skipped" in out


def test_6_debug_and_tb_after_a_release_give_ipythons_own_message(oom_shell, caplog):
    ip = oom_shell
    run(ip, FAILING_CELL)
    _result, out = run(ip, "%tb")
    assert "AttributeError" not in out and "No traceback available" in out
    with caplog.at_level("ERROR"):
        _result, out = run(ip, "%debug")
    assert "AttributeError" not in out + caplog.text
    assert "No traceback has been produced" in caplog.text


# -- 2. the OOM message parser is linear ---------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda n: "CUDA out of memory. " + "7" * n,
    lambda n: "CUDA out of memory. Tried to allocate " + "7" * n,
    lambda n: "CUDA out of memory. " + "1." * (n // 2),
    lambda n: "CUDA out of memory. 7" + " " * n,
    lambda n: "CUDA out of memory. " + "out of memory " * (n // 14),
    lambda n: "CUDA out of memory. " + "GPU " * (n // 4),
    lambda n: "CUDA out of memory. " + "Process 1 has " * (n // 14),
    lambda n: "out of memory " * (n // 14) + " no device named",
])
def test_2_a_megabyte_message_parses_in_linear_time(make):
    text = make(1_000_000)
    t0 = time.thread_time()  # this thread's CPU only: threads other tests left running do not count
    parsed = parse_oom_message(text)
    assert time.thread_time() - t0 < 0.5
    if parsed is not None:
        assert parsed.requested_bytes is None or parsed.requested_bytes < 2**80


def test_2_huge_numbers_are_not_read_as_sizes():
    parsed = parse_oom_message("CUDA out of memory. Tried to allocate " + "9" * 5000 + " GiB. GPU " + "1" * 5000)
    assert parsed is not None and parsed.requested_bytes is None and parsed.device is None


# -- 3. one bad reading must not corrupt the ring buffer -----------------------------------

@pytest.mark.parametrize("bad", [math.nan, math.inf, -5, 2**70, "<b>hot</b>", object(), 1e300])
def test_3_a_bad_value_becomes_a_gap_and_columns_stay_aligned(bad):
    ring = RingColumns([("t_s", "f"), ("temp_c", "B"), ("power_w", "f"), ("events", "I")], capacity=4)
    for i in range(10):
        ring.append({"t_s": float(i), "temp_c": bad if i % 3 == 0 else 40, "power_w": bad if i % 2 else 100.0,
                     "events": bad})
    cols = ring.tail()
    assert {len(v) for v in cols.values()} == {4}
    assert cols["t_s"] == [6.0, 7.0, 8.0, 9.0]
    assert cols["temp_c"] == [None, 40, 40, None] and cols["power_w"] == [100.0, None, 100.0, None]
    assert cols["events"] == [None] * 4


def test_3_one_garbage_reading_keeps_the_rest_of_the_row(fake):
    fake.gpus[0].garbage["nvmlDeviceGetTemperature"] = math.nan
    sampler = Sampler(NvmlSession(fake), capacity=4)
    for _ in range(6):
        sampler.tick()
    cols = sampler.samples()
    assert {len(v) for v in cols.values()} == {4}
    assert cols["gpu0_temp_c"] == [None] * 4
    assert all(v is not None for v in cols["gpu0_util_pct"]) and all(v is not None for v in cols["gpu0_power_w"])
    assert any("malformed" in n for n in sampler.notes)


# -- 4. transient NVML errors are retried, not remembered ----------------------------------

def test_4_a_timeout_from_device_count_at_start_is_retried(fake, monkeypatch):
    monkeypatch.setattr(sampler_module, "REDISCOVER_S", (0.05, 1.0), raising=False)
    fake.transient["nvmlDeviceGetCount"] = [nvml_module.TIMEOUT]
    sampler = Sampler(NvmlSession(fake))
    assert sampler.gpus == ()
    deadline = time.monotonic() + 3
    while not sampler.gpus and time.monotonic() < deadline:
        sampler.tick()
        time.sleep(0.02)
    assert len(sampler.gpus) == 1
    sampler.tick()
    cols = sampler.samples()
    assert cols["gpu0_util_pct"][-1] is not None and len(cols["gpu0_util_pct"]) == len(cols["t_s"])
    assert any("found 1 GPU" in n for n in sampler.notes)


def test_4_a_failed_nvml_init_is_retried(fake, monkeypatch):
    monkeypatch.setattr(nvml_module, "RETRY_S", (0.05, 1.0), raising=False)
    monkeypatch.setattr(sampler_module, "REDISCOVER_S", (0.05, 1.0), raising=False)
    fake.transient["nvmlInit"] = [nvml_module.DRIVER_NOT_LOADED]
    session = NvmlSession(fake)
    assert not session.start().ok
    sampler = Sampler(session)
    deadline = time.monotonic() + 3
    while not sampler.gpus and time.monotonic() < deadline:
        sampler.tick()
        time.sleep(0.02)
    assert session.start().ok and len(sampler.gpus) == 1 and sampler.status.ok


# -- 5. a malformed reading must not crash the checklist -----------------------------------

def test_5_memory_info_none_gives_json_not_a_traceback(fake, capsys):
    from gpunb.cli import main

    fake.gpus[0].garbage["nvmlDeviceGetMemoryInfo"] = None
    code = main(["check", "--quick", "--json"])
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert code in (0, 1) and "Traceback" not in out.err
    assert report["checks"][0]["id"] == "driver"
    assert "malformed" in json.dumps(report)


def test_5_a_crash_while_reading_nvml_is_a_failed_check(fake, monkeypatch):
    from gpunb.analysis.checks import checklist as checks

    def broken(*args, **kwargs):
        raise RuntimeError("reader bug")

    monkeypatch.setattr(checks, "read_snapshot", broken)
    report = checks.check(quick=True)
    driver = report["driver"]
    assert driver.status == "fail" and "reader bug" in driver.cause
    assert report["host_cpu_ram"].status != "skip"  # the rest of the checklist still ran


# -- 7. a hanging NVML costs a cell a bounded time ------------------------------------------

def _hang_every_call(fake, seconds: float) -> None:
    slow = {name: seconds for name in dir(fake) if name.startswith("nvml") and name != "nvmlInit"}
    fake.hangs.update(slow)
    for gpu in fake.gpus:
        gpu.hangs.update(slow)


@pytest.mark.parametrize("fault", ["every call 0.2 s", "power hangs", "memory hangs", "count hangs"])
def test_7_check_memory_and_monitor_take_at_most_two_seconds(fault, monkeypatch):
    import gpunb
    from gpunb.shells import monitor as monitor_module
    from gpunb.shells.kernel_state import STANDALONE_STATE

    f = scenario("h200")
    if fault == "every call 0.2 s":
        _hang_every_call(f, 0.2)
    else:
        name = {"power hangs": "nvmlDeviceGetPowerUsage", "memory hangs": "nvmlDeviceGetMemoryInfo",
                "count hangs": "nvmlDeviceGetCount"}[fault]
        (f.hangs if fault == "count hangs" else f.gpus[0].hangs)[name] = FOREVER
    for what in ("check", "memory", "monitor"):
        install(f)  # a fresh session: each entry point meets the hang first
        t0 = time.monotonic()
        if what == "check":
            report = gpunb.check(quick=True)
            assert report.to_json()
        elif what == "memory":
            report = gpunb.memory()
            assert report._repr_mimebundle_()["text/plain"]
        else:
            mon = gpunb.monitor(frontend="text")
            assert mon.text()
            mon.stop()
        took = time.monotonic() - t0
        assert took < 2.0, f"{what} took {took:.2f} s with {fault}"
    monitor_module.stop_all(STANDALONE_STATE)
    STANDALONE_STATE.sampler = None
    f.release_hangs()
    nvml_module.set_default_session(None)


def test_7_check_names_what_timed_out(fake):
    import gpunb

    fake.gpus[0].hangs["nvmlDeviceGetPowerUsage"] = FOREVER
    report = gpunb.check(quick=True)
    power = report["power"]
    assert power.status == "skip" and "nvmlDeviceGetPowerUsage on GPU 0" in power.summary
    assert "did not answer" in power.summary or "not answered" in power.summary
    assert report["temperature"].status == "ok"  # the rest was read


def test_7_unload_during_a_hang_is_quick_and_leaves_no_second_sampler(ip, fake):
    run(ip, "%gpumonitor --hz 10")
    assert len(sampler_threads()) == 1
    _hang_every_call(fake, 12.0)
    time.sleep(0.3)  # the sampler thread is now inside a hung tick
    t0 = time.monotonic()
    ip.run_line_magic("unload_ext", "gpunb")
    assert time.monotonic() - t0 < 1.0
    ip.run_line_magic("load_ext", "gpunb")
    run(ip, "%gpumonitor --hz 10")
    for _ in range(10):
        assert len(sampler_threads()) <= 1
        time.sleep(0.05)
    run(ip, "%gpumonitor --stop")
    assert sampler_threads() == []


# -- 8. leaks: listeners, display handles and configurables ------------------------------------

def test_8_a_live_monitor_leaves_no_listener_and_needs_no_widget_model(fake):
    import gpunb

    mon = gpunb.monitor(frontend="live")
    with capture_output() as out:
        mon._ipython_display_()
    mon.stop()
    assert "application/vnd.jupyter.widget-view+json" not in out.outputs[0].data  # plain HTML, nothing to leak
    for _ in range(20):
        mon = gpunb.monitor(frontend="live")
        with capture_output():
            mon._ipython_display_()
        mon.stop()
    assert mon.sampler.listener_count == 0 and not mon.sampler.running


def test_8_load_unload_leaves_no_configurables(ip):
    before = len(ip.configurables)
    for _ in range(5):
        ip.run_line_magic("unload_ext", "gpunb")
        ip.run_line_magic("load_ext", "gpunb")
    assert len(ip.configurables) == before


# -- 9. the command line ---------------------------------------------------------------

def _cli(*args: str, env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "GPUNB_FAKE_NVML": "h200", "PYTHONPATH": os.getcwd(), **(env or {})}
    return subprocess.run([sys.executable, "-m", "gpunb", "check", "--quick", *args], capture_output=True,
                          text=True, env=full_env, cwd=cwd, timeout=120)


def test_9_deleted_working_directory(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    code = (f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); sys.argv = ['gpunb', 'check', "
            "'--quick', '--json']; from gpunb.cli import main; sys.exit(main())")
    env = {**os.environ, "GPUNB_FAKE_NVML": "h200", "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in out.stderr and out.returncode in (0, 1), out.stderr
    disk = next(c for c in json.loads(out.stdout)["checks"] if c["id"] == "disk")
    assert disk["status"] == "warn" and "current directory" in disk["summary"] and "deleted" in disk["summary"]


def test_9_cuda_visible_devices_with_thousands_of_digits():
    out = _cli("--json", env={"CUDA_VISIBLE_DEVICES": "1" * 4400})
    assert "Traceback" not in out.stderr and out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    visible = next(c for c in report["checks"] if c["id"] == "cuda_visible_devices")
    assert visible["status"] == "fail" and "does not exist" in visible["cause"]
    assert len(out.stdout) < 20_000  # the 4,400 digits are not repeated at length


def test_9_unknown_fake_nvml_scenario():
    out = _cli("--json", env={"GPUNB_FAKE_NVML": "bogus"})
    assert "Traceback" not in out.stderr and out.returncode == 1, out.stderr
    driver = json.loads(out.stdout)["checks"][0]
    assert driver["status"] == "fail" and "GPUNB_FAKE_NVML='bogus'" in driver["cause"]


def test_9_unknown_fake_nvml_scenario_in_a_kernel(ip, monkeypatch):
    monkeypatch.setenv("GPUNB_FAKE_NVML", "bogus")
    nvml_module.set_default_session(None)
    result, out = run(ip, "%gpucheck --quick")
    nvml_module.set_default_session(None)
    assert result.success and "Traceback" not in out and "GPUNB_FAKE_NVML='bogus'" in out


def test_9_a_crash_of_gpunb_exits_3_with_a_json_error(fake, monkeypatch, capsys):
    from gpunb import cli
    from gpunb.analysis.checks import checklist as checks

    def crash(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(checks, "check", crash)
    assert cli.main(["check", "--quick", "--json"]) == 3
    out = capsys.readouterr()
    error = json.loads(out.out)["error"]
    assert error["type"] == "ZeroDivisionError" and "a bug" in error["message"] and error["fix"]
    assert cli.main(["check", "--quick"]) == 3
    assert "gpunb itself failed" in capsys.readouterr().err
    assert cli.main(["check", "--bogus"]) == 2  # bad arguments: argparse's message, exit status 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


# -- 10. a lost GPU, and the monitor's rate ------------------------------------------------

def test_10_checks_that_read_nothing_do_not_say_ok():
    import gpunb

    install(scenario("gpu-lost"))
    try:
        report = gpunb.check(quick=True)
    finally:
        nvml_module.set_default_session(None)
    for check_id in ("gpu_processes", "ecc", "persistence_mode", "mig_mode", "compute_mode", "precision"):
        c = report[check_id]
        assert c.status in ("skip", "warn"), (check_id, c.status, c.summary)
        assert "lost" in c.summary or "could not" in c.summary, (check_id, c.summary)
    visible = report["cuda_visible_devices"]
    assert "all 0 GPU" not in visible.summary and visible.status != "ok"


def test_10_device_of_a_lost_gpu_is_refused(fake2):
    from gpunb.analysis.checks.checklist import DeviceChoiceError, check

    with pytest.raises(DeviceChoiceError, match="lost"):
        check(quick=True, device=1)
    assert check(quick=True, device=0)["temperature"].status == "ok"


def test_10_a_second_monitor_does_not_silently_slow_a_running_one(ip, fake):
    import gpunb

    run(ip, "%gpumonitor --hz 4 -o fast")
    slow = gpunb.monitor(hz=2, frontend="text")
    fast = ip.user_ns["fast"]
    assert fast.hz == 4 and slow.hz == 4
    assert any("4 Hz" in m and "2 Hz" in m for m in slow.messages)
    fast.stop()
    assert slow.hz == 2  # the faster request is gone: back to what this one asked for
    run(ip, "%gpumonitor --stop")
