"""Every file gpunb writes, and every file it reads from a place another user may write, goes
through the one guarded place (``gpunb/readings/untrusted_file.py``). This test finds every
file-system call in gpunb's source (``tests/file_access_scan.py``, by ``ast``) and fails on
any the allow-list below does not name with a reason; a new ``open(``, ``Path.write_text``,
``shutil`` write or profiler export elsewhere must go through the guard or be listed here,
where a reviewer sees why it is safe. An entry no longer in the code fails too (the list
stays true)."""

from __future__ import annotations

from collections import Counter

from tests.file_access_scan import file_accesses

PROC = "reads /proc, which the kernel writes, not another user"
PACKAGED = "reads a file shipped inside the gpunb package (site-packages), not a shared place"
UNNAMED = "an unnamed temporary file (no path another user could plant or follow)"

ALLOWED: dict[tuple[str, str, str], str] = {
    ("readings/cuda_probe.py", "_run", "tempfile.TemporaryFile"):
        "the probe's stderr: an anonymous file (O_TMPFILE, or made O_EXCL 0600 and unlinked at once) that "
        "no other user can open or replace",
    ("readings/pci.py", "nvidia_gpu_on_bus", "Path.read_text"):
        "reads the kernel's own sysfs (/sys/bus/pci/devices/*/vendor, class): files only the kernel writes, "
        "a few bytes each; no other user can plant or redirect them",
    ("analysis/ranks/channel.py", "RankChannel.open", "tempfile.mkdtemp"):
        "the rank channel's folder: mkdtemp makes it 0700 with O_EXCL semantics; workers reopen it by "
        "identity (device, inode) and write only through GuardedFolder (channel_dir.py)",
    ("analysis/ranks/channel.py", "RankChannel.close", "shutil.rmtree"):
        "removes the kernel's own channel folder; rmtree works by descriptor and never follows a link",
    ("analysis/ranks/channel_dir.py", "open_dir", "os.open"):
        "opens the channel folder O_DIRECTORY|O_NOFOLLOW and checks its identity, owner and mode 0700 "
        "before GuardedFolder.borrow writes into it",
    ("analysis/steps/op_trace.py", "OpTrace._write_trace", "export_chrome_trace"):
        "handed to trace_file.write_trace, which gives torch only a /proc/self/fd/<fd>/<name> path inside a "
        "private GuardedFolder (the renamed-folder attack of issue 31: tests/test_guarded_folder.py)",
    ("analysis/steps/profiler_log.py", "quiet_profiler_log", "tempfile.TemporaryFile"): UNNAMED,
    ("cli.py", "_emit", "os.open"): "opens os.devnull for writing after stdout failed (engineer 30's stream handling)",
    ("readings/allreduce.py", "AllReduceLaunch.start", "tempfile.TemporaryDirectory"):
        "the NCCL test's rendezvous folder: mkdtemp, 0700, this process's own",
    ("readings/allreduce.py", "AllReduceLaunch.start", "tempfile.TemporaryFile"): UNNAMED,
    ("readings/devices.py", "namespace_pids", "open"): PROC,
    ("readings/process.py", "reset_peak_rss", "open"): PROC + " (/proc/self/clear_refs, this process's own)",
    ("readings/process.py", "_status_kib", "open"): PROC,
    ("readings/process_facts.py", "read_ppid", "open"): PROC,
    ("readings/process_facts.py", "_boot_time", "open"): PROC,
    ("readings/process_facts.py", "_read", "open"): PROC,
    ("readings/server_trust.py", "_listeners", "open"): PROC + " (/proc/net/tcp: who listens on a port)",
    ("readings/torch_build.py", "_version_file_assignments", "Path.read_text"):
        "reads torch/version.py inside the installed torch package (parsed by ast, never run)",
    ("testing/fake_nvml.py", "load_trace", "Path.read_text"): PACKAGED,
    ("testing/fake_nvml.py", "load_energy_links", "open"): PACKAGED,
    ("testing/fake_nvml.py", "load_nvlink_pair", "Path.read_text"): PACKAGED,
    ("testing/fake_nvml.py", "_running", "open"): PROC,
    ("testing/fake_nvml.py", "replay_probe", "Path.read_text"):
        "tests replay a recorded probe output from tests/data (a test helper, never called by gpunb itself)",
}


def test_every_file_access_outside_the_guard_is_on_the_allow_list_with_a_reason():
    found = Counter((a.module, a.function, a.call) for a in file_accesses())
    new = sorted(set(found) - set(ALLOWED))
    assert not new, ("file-system calls outside gpunb/readings/untrusted_file.py: go through GuardedFolder / "
                     f"read_json, or add each to ALLOWED with the reason it is safe: {new}")
    gone = sorted(set(ALLOWED) - set(found))
    assert not gone, f"ALLOWED names calls no longer in the code (remove them): {gone}"
    assert all(len(reason) > 20 for reason in ALLOWED.values())


def test_the_scan_finds_what_it_is_meant_to_find(tmp_path):
    """The scanner itself: each kind of call it must catch, in a made-up package."""
    (tmp_path / "mod.py").write_text(
        "import os, shutil, tempfile\nfrom pathlib import Path\n"
        "def f(p, prof):\n"
        "    open(p, 'w')\n    os.open(p, 0)\n    Path(p).write_text('x')\n    p.read_bytes()\n"
        "    shutil.copy(p, p)\n    tempfile.mkdtemp()\n    prof.export_chrome_trace(p)\n    os.replace(p, p)\n"
        "    Path(p).open('w')\n    'a'.replace('a', 'b')\n    g(prof.export_chrome_trace)\n")
    calls = [a.call for a in file_accesses(tmp_path)]
    assert calls == ["open", "os.open", "Path.write_text", "Path.read_bytes", "shutil.copy", "tempfile.mkdtemp",
                     "export_chrome_trace", "os.replace", "Path.open", "export_chrome_trace"]
