"""Replay issue 31's attack on the --ops trace as a real race, two uids, and count the victim's
files overwritten: the old way (a private staging folder, then torch handed a *path* in it)
against ``trace_file.write_trace`` (torch handed ``/proc/self/fd/<fd>/<name>``).

An attacker process (another uid) loops: every staging folder it sees in the group-shared,
non-sticky project folder it renames away and replaces by a link to its own folder, where
links point at the victim's 0600 file. Needs root (to have a second uid).

    python benchmarks/staging_race.py --rounds 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpunb.analysis.steps.trace_file import write_trace
from tests.second_uid import ATTACKER_GID, ATTACKER_UID

NAME = "gpuprofile-cell1-20261205-000000.pt.trace.json"
TRACE = '{"traceEvents": []}' + " " * 50_000  # about the 52 KB of the review's trace


def slow_torch_like_save(path: str) -> None:
    """torch's export: ``<path>.tmp`` by a plain open (following links), written in pieces, renamed."""
    with open(path + ".tmp", "w") as f:
        for i in range(0, len(TRACE), 4096):
            f.write(TRACE[i:i + 4096])
            time.sleep(0.0005)
    os.replace(path + ".tmp", path)


def old_way(save, wanted: Path) -> None:
    staging = tempfile.mkdtemp(dir=wanted.parent, prefix=".gpunb-trace-")
    time.sleep(0.005)  # the profiler's own work between making the folder and exporting
    save(os.path.join(staging, wanted.name))


def racer(folder: Path, own: Path, victim: Path, stop_after_s: float) -> int:
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setgroups([])
        os.setgid(ATTACKER_GID)
        os.setuid(ATTACKER_UID)
        for name in (NAME, NAME + ".tmp"):
            if not os.path.lexists(own / name):
                os.symlink(victim, own / name)
        end = time.monotonic() + stop_after_s
        while time.monotonic() < end:
            try:
                for entry in os.listdir(folder):
                    if entry.startswith(".gpunb-trace-") and not entry.endswith(".gone"):
                        try:
                            os.rename(folder / entry, folder / f"{entry}.{time.monotonic_ns()}.gone")
                            os.symlink(own, folder / entry)
                        except OSError:
                            pass
            except OSError:
                pass
    finally:
        os._exit(0)


def round_(how: str) -> bool:
    base = Path(tempfile.mkdtemp(prefix="gpunb-race-", dir="/tmp"))
    os.chmod(base, 0o755)
    folder, own, victim = base / "project", base / "attackers-own", base / "victim-secret"
    folder.mkdir()
    os.chown(folder, 0, ATTACKER_GID)
    os.chmod(folder, 0o770)  # group-shared, no sticky bit
    own.mkdir()
    os.chown(own, ATTACKER_UID, ATTACKER_GID)
    victim.write_text("the victim's own data")
    os.chmod(victim, 0o600)
    pid = racer(folder, own, victim, 3.0)
    time.sleep(0.05)
    try:
        if how == "old":
            old_way(slow_torch_like_save, folder / NAME)
        else:
            write_trace(slow_torch_like_save, folder / NAME)
    except OSError:
        pass  # the old way may also just fail
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    overwritten = victim.read_text() != "the victim's own data"
    import shutil

    shutil.rmtree(base, ignore_errors=True)
    return overwritten


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: the attacker is a second uid")
    out = {how: sum(round_(how) for _ in range(args.rounds)) for how in ("old", "write_trace")}
    print(json.dumps({"rounds": args.rounds, "victim_overwritten": out}))


if __name__ == "__main__":
    main()
