"""Files another process could have written (issue 21, issue 22 "the report lost to a stray
file"): a symlink, a FIFO, a huge file, another user's file, JSON of the wrong shape. Each is
ignored with one sentence, never a traceback, never a hang."""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time

import pytest

from gpunb.readings import peak_cache
from gpunb.readings import untrusted_file as uf

UUID = "GPU-12bebae7-3cb1-fcf7-294c-65779ece26ff"
GOOD = {UUID: {"name": "NVIDIA H200", "tflops": {"bf16": 790.0}, "measured_at": "2026-12-01 10:00",
               "pid": 1, "torch_version": "2.13"}}


def _within(seconds: float, fn, *args, **kwargs):
    """``fn`` in a thread; fails the test (instead of hanging it) when it blocks."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} blocked for more than {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_a_regular_file_of_this_user_is_read(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('{"x": 1}')
    os.chmod(p, 0o600)
    assert uf.read_json(p, owned=True) == {"x": 1}


def test_a_symlink_is_never_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text('{"x": 1}')
    link = tmp_path / "a.json"
    link.symlink_to(secret)
    with pytest.raises(uf.Untrusted, match="symbolic link"):
        uf.read_json(link)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(uf.Untrusted, match="symbolic link"):
            uf.read_json("a.json", dir_fd=fd)
    finally:
        os.close(fd)


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "a.json"
    os.mkfifo(fifo)
    with pytest.raises(uf.Untrusted, match="not a regular file"):
        _within(2.0, uf.read_json, fifo)


def test_size_cap_shape_and_parse_errors_name_the_file(tmp_path):
    p = tmp_path / "a.json"
    p.write_text(" " * 2000 + "{}")
    with pytest.raises(uf.Untrusted, match="more than the 1000 bytes"):
        uf.read_json(p, max_bytes=1000)
    p.write_text("[1, 2]")
    with pytest.raises(uf.Untrusted, match="JSON list"):
        uf.read_json(p)
    p.write_text('{"x": ')
    with pytest.raises(uf.Untrusted, match="not valid JSON"):
        uf.read_json(p)
    p.write_text("[" * 100000)
    with pytest.raises(uf.Untrusted, match="not valid JSON"):
        uf.read_json(p)


def test_another_users_or_a_group_writable_file_is_refused(tmp_path, monkeypatch):
    p = tmp_path / "a.json"
    p.write_text("{}")
    os.chmod(p, 0o620)
    with pytest.raises(uf.Untrusted, match="writable by other users"):
        uf.read_json(p, owned=True)
    os.chmod(p, 0o600)
    monkeypatch.setattr(uf, "my_uid", lambda: os.getuid() + 1)
    with pytest.raises(uf.Untrusted, match="belongs to uid"):
        uf.read_json(p, owned=True)
    assert "belongs to uid" in uf.check_private_dir(tmp_path)


# -- the peak cache ---------------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / peak_cache.FILE_NAME
    monkeypatch.setattr(peak_cache, "cache_file", lambda environ=None: path)  # (conftest's private cache)
    peak_cache.forget_this_process()
    yield path
    peak_cache.forget_this_process()


@pytest.mark.parametrize("entry", [
    {"tflops": {"bf16": "fast"}},
    {"tflops": [1, 2]},
    {"tflops": {"bf16": 790.0}, "pid": "x"},
    {"tflops": {"bf16": 790.0}, "pid": 2**70.0},
    {"tflops": {"bf16": 790.0}, "name": ["a"]},
    {"tflops": {"bf16": True}},
    "not a dict",
])
def test_a_wrong_typed_entry_is_ignored_with_a_note(cache, entry):
    cache.write_text(json.dumps({UUID: entry}))
    peaks, note = peak_cache.lookup_noted(UUID)
    assert peaks is None and "entry for this GPU was ignored" in note and str(cache) in note


def test_a_fifo_or_a_list_or_a_symlink_as_the_cache_costs_nothing(cache, tmp_path):
    os.mkfifo(cache)
    peaks, note = _within(2.0, peak_cache.lookup_noted, UUID)
    assert peaks is None and "not a regular file" in note
    os.unlink(cache)
    cache.write_text("[]")
    assert "JSON list" in peak_cache.lookup_noted(UUID)[1]
    os.unlink(cache)
    (tmp_path / "elsewhere.json").write_text(json.dumps(GOOD))
    cache.symlink_to(tmp_path / "elsewhere.json")
    assert "symbolic link" in peak_cache.lookup_noted(UUID)[1]
    os.unlink(cache)
    cache.write_text(json.dumps(GOOD))
    assert peak_cache.lookup_noted(UUID)[0].tflops == {"bf16": 790.0}


def test_a_bad_cache_is_replaced_by_the_next_measurement(cache):
    cache.write_text("[]")
    assert peak_cache.remember(UUID, "H200", {"bf16_tflops": 790.0}) is not None
    peak_cache.forget_this_process()
    assert peak_cache.lookup(UUID).tflops == {"bf16": 790.0}
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o600


def test_a_full_disk_leaves_no_temporary_file(cache, monkeypatch):
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r": Full(real_fdopen(fd, mode)))
    assert peak_cache.remember(UUID, "H200", {"bf16_tflops": 790.0}) is not None  # kept in this process
    assert os.listdir(cache.parent) == []


def test_the_profile_says_why_a_cached_peak_was_ignored():
    from gpunb.analysis.profile.throughput import assess
    from gpunb.analysis.steps.records import FlopCount

    count = FlopCount(step=1, flops=10**12, by_precision={"bf16": 1e12}, by_op={}, bytes_moved=0, ops=1, host_ms=1.0,
                      gpu_flops=10**12)
    t = assess(count, "", 10.0, "NVIDIA H200", None, "the measured-peak cache was ignored: x")
    assert t.measured_source.startswith("the measured-peak cache was ignored")


def test_time_is_bounded_for_a_huge_cache(cache):
    cache.write_text(" " * (peak_cache.MAX_BYTES + 10))
    t0 = time.perf_counter()
    assert "more than" in peak_cache.lookup_noted(UUID)[1]
    assert time.perf_counter() - t0 < 0.5


# -- the peak cache's numbers: generated (issue 31: a 400-digit integer raised OverflowError in
# %gpumonitor and at a profiled cell's end; a planted 1e30 TFLOP/s was believed) ------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402

_ANY_NUMBER = hst.one_of(
    hst.integers(min_value=-(10**400), max_value=10**400),
    hst.floats(allow_nan=False, allow_infinity=False),
    hst.sampled_from([10**400, -(10**400), 1e30, 1e308, 0, -1, True, False, 790.0, 20_000.0, 20_000.5]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bf16=_ANY_NUMBER, h2d=_ANY_NUMBER, pid=_ANY_NUMBER)
def test_no_planted_number_raises_or_is_believed_out_of_range(tmp_path_factory, monkeypatch, bf16, h2d, pid):
    folder = tmp_path_factory.mktemp("cache")
    path = folder / peak_cache.FILE_NAME
    monkeypatch.setattr(peak_cache, "cache_file", lambda environ=None: path)
    path.write_text(json.dumps({UUID: {"name": "NVIDIA H200", "tflops": {"bf16": bf16}, "copy_gbps": {"h2d": h2d},
                                       "measured_at": "x", "pid": pid, "torch_version": ""}}))
    peak_cache.forget_this_process()
    peaks, note = peak_cache.lookup_noted(UUID)  # never raises
    if peaks is None:
        assert "ignored" in note and str(path) in note
        return
    for value in (*peaks.tflops.values(), *peaks.copy_gbps.values()):
        assert isinstance(value, float) and 0 < value <= peak_cache.MAX_TFLOPS
    assert peaks.tflops.get("bf16", 1.0) <= peak_cache.MAX_TFLOPS
    assert peaks.copy_gbps.get("h2d", 1.0) <= peak_cache.MAX_COPY_GBPS


def test_a_400_digit_peak_costs_the_monitor_and_a_profiled_cell_nothing(cache, fake_nvml):
    import gpunb

    huge = "9" * 400
    text = json.dumps({UUID: {"name": "H200", "tflops": {"bf16": 1.5}, "copy_gbps": {"h2d": 2.5}, "pid": 1,
                              "measured_at": "", "torch_version": ""}})
    cache.write_text(text.replace("1.5", huge).replace("2.5", huge))
    assert peak_cache.lookup(UUID) is None  # what the monitor's PCIe limit lines read (traffic.py)
    assert "ignored" in peak_cache.lookup_noted(UUID)[1]
    with gpunb.profile(record=False, show=False) as p:
        sum(range(1000))
    assert p.result is not None  # the cell's end read the cache and went on


def test_a_cache_another_user_can_move_is_not_believed(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    monkeypatch.setattr(peak_cache, "cache_file", lambda environ=None: folder / peak_cache.FILE_NAME)
    (folder / peak_cache.FILE_NAME).write_text(json.dumps(GOOD))
    peak_cache.forget_this_process()
    os.chmod(folder, 0o777)  # no sticky bit: anyone could have put this file there
    peaks, note = peak_cache.lookup_noted(UUID)
    assert peaks is None and "without the sticky bit" in note
    os.chmod(folder, 0o700)
    assert peak_cache.lookup_noted(UUID)[0].tflops == {"bf16": 790.0}
