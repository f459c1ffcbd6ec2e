"""The one guarded place for the file system (``untrusted_file.GuardedFolder``), attacked by a
real second uid (``tests/second_uid.py``; skipped when not root, run in CI).

The named attack (issue 31): ``%%gpuprofile --ops`` made a private staging folder in the
notebook's folder and handed torch a *path* inside it. In a folder others can write without the
sticky bit, renaming a folder needs no right on the folder itself, so the attacker renames the
staging folder away and puts a link to his own folder in its place; torch follows it and
overwrites whatever his folder links to. The first test replays it against the old way (the
attack works: the test can fail) and against ``write_trace`` (it does not). The generated cases
then vary the folder's mode and owner, what already sits at the trace's name, and the moment
the attacker acts; every time the write lands privately or is refused with a sentence, and
never goes through another user's link."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpunb.analysis.steps import trace_file
from gpunb.readings.untrusted_file import GuardedFolder, NotWritten
from tests.second_uid import ATTACKER_GID, ATTACKER_UID, as_attacker, needs_root, reachable_folder

TRACE = '{"traceEvents": []}'
VICTIM = "the victim's own data"
NAME = "gpuprofile-cell3-20261205-101010.pt.trace.json"


class TorchLikeSave:
    """What torch's ``export_chrome_trace`` does with a path: ``<path>.tmp`` by a plain open
    (following links), renamed; ``before`` runs first (the attacker's moment)."""

    def __init__(self, before=None, during=None):
        self.before, self.during = before, during

    def __call__(self, path: str) -> None:
        if self.before:
            self.before(path)
        with open(path + ".tmp", "w") as f:
            f.write(TRACE)
        if self.during:
            self.during(path)
        os.replace(path + ".tmp", path)


def _old_write_by_path(save, wanted: Path) -> None:
    """The way issue 31 found it: a private folder by ``mkdtemp``, then a path inside it."""
    staging = tempfile.mkdtemp(dir=wanted.parent, prefix=".gpunb-trace-")
    save(os.path.join(staging, wanted.name))


def _scene(base: str, mode: int, owner_uid: int = 0) -> tuple[Path, Path, Path]:
    """(the notebook folder, the victim's 0600 file, the attacker's own folder)."""
    folder = Path(base) / "project"
    folder.mkdir()
    os.chown(folder, owner_uid, ATTACKER_GID)  # the attacker is in the folder's group
    os.chmod(folder, mode)
    victim = Path(base) / "victim-secret"
    victim.write_text(VICTIM)
    os.chmod(victim, 0o600)
    own = Path(base) / "attackers-own"
    own.mkdir()
    os.chown(own, ATTACKER_UID, ATTACKER_GID)
    return folder, victim, own


def _swap_staging_for_link(folder: Path, own: Path, victim: Path) -> None:
    """The attacker: rename gpunb's staging folder away, link his own folder in its place, with
    links to the victim's file where torch writes."""
    for entry in os.listdir(folder):
        if entry.startswith(".gpunb-trace-") and not entry.endswith(".gone"):
            os.rename(folder / entry, folder / (entry + ".gone"))
            for name in (NAME, NAME + ".tmp"):
                if not os.path.lexists(own / name):
                    os.symlink(victim, own / name)
            os.symlink(own, folder / entry)
            return
    raise FileNotFoundError("no staging folder to swap")


@needs_root
def test_the_renamed_staging_folder_attack_works_on_a_path_and_not_on_write_trace():
    with reachable_folder() as base:
        folder, victim, own = _scene(base, 0o770)  # a group-shared project folder, no sticky bit
        attack = TorchLikeSave(before=lambda path: as_attacker(lambda: _swap_staging_for_link(folder, own, victim)))
        _old_write_by_path(attack, folder / NAME)
        assert victim.read_text() == TRACE  # reproduced: the victim's file was overwritten through his link

    with reachable_folder() as base:
        folder, victim, own = _scene(base, 0o770)
        swapped = []
        attack = TorchLikeSave(before=lambda path: swapped.append(
            as_attacker(lambda: _swap_staging_for_link(folder, own, victim))))
        path, size, note = trace_file.write_trace(attack, folder / NAME)
        assert swapped == [True]  # the attacker did rename the staging folder and plant his link
        assert victim.read_text() == VICTIM and stat.S_IMODE(victim.stat().st_mode) == 0o600
        assert (path, size) == (str(folder / NAME), len(TRACE)) and "no sticky bit" in note
        placed = os.lstat(path)
        assert stat.S_ISREG(placed.st_mode) and placed.st_uid == os.getuid() and stat.S_IMODE(placed.st_mode) == 0o600
        assert Path(path).read_text() == TRACE
        assert not as_attacker(lambda: open(path).read())  # noqa: SIM115 (the attacker cannot read it)


# -- generated cases --------------------------------------------------------------------------------

MODES = (0o700, 0o755, 0o770, 0o777, 0o1770, 0o1777)
EXISTING = ("nothing", "attackers-file", "link-to-victim", "hardlink-of-victim", "fifo", "folder", "tmp-link")
RACE = ("none", "before-torch", "between-tmp-and-rename", "before-placing", "link-at-name-before-placing")


def _plant(existing: str, folder: Path, victim: Path) -> bool:
    """Put ``existing`` at the trace's name (as the attacker, where the folder lets him); True
    when something is there now."""
    target = folder / NAME
    if existing == "attackers-file":
        return as_attacker(lambda: target.write_text("the attacker's"))
    if existing == "link-to-victim":
        return as_attacker(lambda: os.symlink(victim, target))
    if existing == "hardlink-of-victim":  # made earlier (protected_hardlinks stops the attacker now)
        os.link(victim, target)
        return True
    if existing == "fifo":
        return as_attacker(lambda: os.mkfifo(target))
    if existing == "folder":
        return as_attacker(lambda: os.mkdir(target))
    if existing == "tmp-link":
        as_attacker(lambda: os.symlink(victim, folder / (NAME + ".tmp")))
    return False


@needs_root
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(MODES), attackers_folder=st.booleans(), existing=st.sampled_from(EXISTING),
       race=st.sampled_from(RACE))
def test_a_trace_lands_privately_or_is_refused_never_through_anothers_link(mode, attackers_folder, existing, race,
                                                                           monkeypatch):
    with reachable_folder() as base:
        private_tmp = Path(base) / "tmp"
        private_tmp.mkdir(mode=0o700)
        monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
        folder, victim, own = _scene(base, mode, ATTACKER_UID if attackers_folder else 0)
        planted = _plant(existing, folder, victim)
        swap = lambda *_: as_attacker(lambda: _swap_staging_for_link(folder, own, victim))  # noqa: E731
        save = TorchLikeSave(before=swap if race == "before-torch" else None,
                             during=swap if race == "between-tmp-and-rename" else None)
        real_place = GuardedFolder.place

        def place(self, *args, **kwargs):
            if race == "before-placing":
                swap()
            elif race == "link-at-name-before-placing":
                as_attacker(lambda: os.symlink(victim, folder / NAME))
            return real_place(self, *args, **kwargs)

        monkeypatch.setattr(GuardedFolder, "place", place)
        path, size, note = trace_file.write_trace(save, folder / NAME)

        assert victim.read_text() == VICTIM and stat.S_IMODE(victim.stat().st_mode) == 0o600
        if not path:
            assert size is None and note.startswith("no trace file: ")
            return
        got = os.lstat(path)
        assert stat.S_ISREG(got.st_mode) and got.st_uid == os.getuid() and stat.S_IMODE(got.st_mode) == 0o600
        assert got.st_ino != victim.stat().st_ino and Path(path).read_text() == TRACE and size == len(TRACE)
        if path == str(folder / NAME):
            assert not attackers_folder and not planted
            assert ("no sticky bit" in note) == bool(mode & 0o022 and not mode & stat.S_ISVTX)
        else:  # kept in a private folder of gpunb's: the note says where and why
            assert note and stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert not as_attacker(lambda: open(path).read())  # noqa: SIM115


# -- the guarded folder's own promises ----------------------------------------------------------------

def test_a_new_file_never_replaces_an_existing_one_nor_follows_a_link(tmp_path):
    (tmp_path / "victim").write_text(VICTIM)
    os.symlink(tmp_path / "victim", tmp_path / "link")
    with GuardedFolder.open(tmp_path) as folder:
        for name in ("victim", "link"):
            with pytest.raises(NotWritten, match="already exists"):
                folder.write_new(name, b"x")
        assert folder.write_new("new", b"abc") == 3
    assert (tmp_path / "victim").read_text() == VICTIM and stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o600


def test_a_write_that_fails_half_way_leaves_nothing_and_says_why(tmp_path):
    def full_disk(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with GuardedFolder.open(tmp_path) as folder, pytest.raises(NotWritten, match="No space left on device"):
        folder.write_new("snap.pickle", full_disk)
    assert os.listdir(tmp_path) == []


def test_a_folder_others_can_write_without_the_sticky_bit_is_not_read_from(tmp_path):
    (tmp_path / "f.json").write_text("{}")
    for mode, trusted in ((0o700, True), (0o1777, True), (0o777, False), (0o770, False)):
        os.chmod(tmp_path, mode)
        with GuardedFolder.open(tmp_path) as folder:
            assert (folder.problem == "") == trusted
            if not trusted:
                assert "without the sticky bit" in folder.problem
    os.chmod(tmp_path, 0o700)


def test_the_fd_path_follows_the_folder_not_its_name(tmp_path):
    (tmp_path / "a").mkdir()
    with GuardedFolder.open(tmp_path / "a") as folder:
        path = folder.path_of("x")
        os.rename(tmp_path / "a", tmp_path / "b")
        (tmp_path / "a").mkdir()
        Path(path).write_text("here")
    assert (tmp_path / "b" / "x").read_text() == "here" and os.listdir(tmp_path / "a") == []
    with pytest.raises(ValueError, match="plain file name"), GuardedFolder.open(tmp_path) as folder:
        folder.path_of("../x")


@needs_root
def test_the_attack_against_torchs_real_profiler_export_writes_nothing_through_the_link(monkeypatch):
    """The same attack with torch's own ``export_chrome_trace`` (CPU profiler): the attacker swaps
    the staging folder for his link right before torch is handed its path."""
    torch = pytest.importorskip("torch")
    import gpunb

    with reachable_folder() as base:
        folder, victim, own = _scene(base, 0o770)
        real_path_of = GuardedFolder.path_of
        swapped = []

        def path_of(self, name):
            if self.name.startswith(str(folder / ".gpunb-trace-")):
                swapped.append(as_attacker(lambda: _swap_staging_for_link(folder, own, victim)))
            return real_path_of(self, name)

        monkeypatch.setattr(GuardedFolder, "path_of", path_of)
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(16, 64)
        with gpunb.profile(record=False, show=False, ops=True, trace_dir=folder) as p:
            for _ in range(9):
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        assert swapped == [True]
        assert victim.read_text() == VICTIM
        o = p.result.ops
        assert o.trace_path.startswith(str(folder)) and o.trace_bytes > 0
        got = os.lstat(o.trace_path)
        assert stat.S_ISREG(got.st_mode) and stat.S_IMODE(got.st_mode) == 0o600 and got.st_uid == os.getuid()
        assert "traceEvents" in Path(o.trace_path).read_text()


@needs_root
@settings(max_examples=80, deadline=None)
@given(folder_mode=st.sampled_from(MODES), attackers_folder=st.booleans(), attackers_file=st.booleans(),
       file_mode=st.sampled_from([0o600, 0o644, 0o664, 0o666]),
       kind=st.sampled_from(["regular", "link-to-mine", "fifo", "folder", "hardlink-of-mine"]))
def test_a_file_is_read_back_only_from_a_place_no_one_else_controls(folder_mode, attackers_folder, attackers_file,
                                                                    file_mode, kind):
    """Reading, generated: the folder's mode and owner, the file's owner, mode and kind. The file
    is read only when the folder is this user's (or root's) and others cannot rename in it, and
    the file is a regular file of this user's that nobody else can write; otherwise a sentence
    naming the file says why. Nothing blocks (a FIFO), nothing follows a link."""
    from gpunb.readings.untrusted_file import Untrusted

    with reachable_folder() as base:
        folder, _, _ = _scene(base, folder_mode, ATTACKER_UID if attackers_folder else 0)
        mine = Path(base) / "mine.json"
        mine.write_text('{"a": 1}')
        target = folder / "f.json"
        if kind == "regular":
            target.write_text('{"a": 1}')
            os.chmod(target, file_mode)
            if attackers_file:
                os.chown(target, ATTACKER_UID, ATTACKER_GID)
        elif kind == "link-to-mine":
            os.symlink(mine, target)
        elif kind == "fifo":
            os.mkfifo(target)
        elif kind == "folder":
            target.mkdir()
        else:
            os.link(mine, target)
        trusted_folder = not attackers_folder and (not folder_mode & 0o022 or folder_mode & stat.S_ISVTX)
        readable = trusted_folder and (kind == "hardlink-of-mine" or (
            kind == "regular" and not attackers_file and not file_mode & 0o022))
        with GuardedFolder.open(folder) as guarded:
            try:
                got = guarded.read_json("f.json")
            except Untrusted as exc:
                assert not readable and ("f.json" in str(exc) or str(folder) in str(exc))
            else:
                assert readable and got == {"a": 1}
