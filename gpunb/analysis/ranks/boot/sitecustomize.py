"""gpunb's start-up hook for worker processes of a profiled cell (not a package: this directory
is put first on ``PYTHONPATH`` only while a ``%%gpuprofile`` cell runs, see rank_channel.py).

Python imports the first ``sitecustomize`` on its path at start-up. This one asks gpunb to
record the process's training steps once it imports torch (``rank_recorder.boot``), then
imports the ``sitecustomize`` that would have run without it (a distribution's or a virtual
environment's), so that one still runs. Anything going wrong here stays silent: a worker must
start as it would have without gpunb.
"""

import os
import sys


def _gpunb_boot() -> None:
    if not os.environ.get("GPUNB_RANK_CHANNEL"):
        return
    try:
        from gpunb.analysis.ranks.recorder import boot
    except Exception:  # gpunb not importable in this interpreter: nothing to record
        return
    try:
        boot()
    except Exception:
        pass


def _chain() -> None:
    """Import the next ``sitecustomize`` on the path, as if this one were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.get("sitecustomize")
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        del sys.modules["sitecustomize"]
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401  (the next one: runs its code, as Python would have)
    except ImportError:
        if me is not None:
            sys.modules["sitecustomize"] = me
    except Exception as exc:  # its own error, reported the way site.py reports it
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
              file=sys.stderr)
    finally:
        sys.path[:] = saved


_gpunb_boot()
_chain()
