"""gpunb's start-up hook for worker processes of a profiled cell (not a package: this directory
is put first on ``PYTHONPATH`` only while a ``%%gpuprofile`` cell runs, see ``channel.py``).

Python imports the first ``sitecustomize`` on its path at start-up, in every process the cell
starts: the ranks, and any unrelated child (``python -c pass``, a tool the cell calls). So this
file costs such a child almost nothing: it imports no module, checks with one ``lstat`` that
the channel directory is the cell's (this user's, 0700, the identity the kernel gave), and
leaves a finder on ``sys.meta_path`` that waits for ``import torch``. Only a process that
imports torch loads gpunb (``recorder.boot``) and records its training steps.

Then it imports the ``sitecustomize`` that would have run without it (a distribution's or a
virtual environment's), so that one still runs; its errors are shown as Python's ``site``
shows them (``Error in sitecustomize; set PYTHONVERBOSE for traceback``). gpunb's own trouble
stays silent: a worker must start as it would have without gpunb.
"""

import os
import sys

TYPE_CHECKING = False  # type checkers read the import below; importing typing costs each child ms
if TYPE_CHECKING:
    from typing import Any


def _gpunb_channel() -> "str | None":
    """The channel directory when it is the profiled cell's; None otherwise."""
    path = os.environ.get("GPUNB_RANK_CHANNEL")
    ident = os.environ.get("GPUNB_RANK_CHANNEL_ID")
    if not path or not ident:
        return None
    try:
        st = os.lstat(path)
    except OSError:  # the cell has ended and its directory is gone
        return None
    mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    if st.st_mode & 0o170777 != 0o040700 or not mine or f"{st.st_dev}:{st.st_ino}" != ident:
        return None  # not the directory the cell made: write nothing there
    return path


class _GpunbLoader:
    """torch's real loader, plus starting gpunb's recorder once torch has run."""

    def __init__(self, loader: "Any") -> None:
        self._loader = loader

    def create_module(self, spec: "Any") -> "Any":
        return self._loader.create_module(spec)

    def exec_module(self, module: "Any") -> None:
        try:
            self._loader.exec_module(module)
        finally:
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
        try:
            from gpunb.analysis.ranks.recorder import boot

            boot()
        except Exception:  # gpunb not importable here, or its trouble: the worker runs as it would
            pass

    def __getattr__(self, name: str) -> "Any":
        return getattr(self._loader, name)


class _GpunbTorchWatch:
    """A ``sys.meta_path`` finder for the one name ``torch``: one string comparison per import."""

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        if fullname != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _GpunbLoader(spec.loader)
                return spec
        return None


def _chain() -> None:
    """Import the next ``sitecustomize`` on the path, as if this one were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.get("sitecustomize")
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        try:
            del sys.modules["sitecustomize"]
            import sitecustomize  # type: ignore[import-not-found]  # noqa: F401  (the next one: runs its code)
        except ImportError as exc:
            if exc.name != "sitecustomize":  # its own import failed: Python's site reports that
                raise
    except Exception as err:  # reported exactly as site.execsitecustomize reports it
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                             f"{err.__class__.__name__}: {err}\n")
    finally:
        sys.path[:] = saved
        if "sitecustomize" not in sys.modules and me is not None:
            sys.modules["sitecustomize"] = me  # none ran, or it failed: Python's import of ours must find ours


if _gpunb_channel() is not None and "torch" not in sys.modules:
    sys.meta_path.insert(0, _GpunbTorchWatch())
_chain()
