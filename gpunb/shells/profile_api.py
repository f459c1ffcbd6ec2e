"""``gpunb.profile()``: the Python twin of ``%%gpuprofile``, recording into the kernel's history."""

from __future__ import annotations

from gpunb.analysis.profile import profile as _Profile
from gpunb.shells.extension import kernel_state


def profile(label: str = "", *, warmup_steps: int = 1, reset_peak: bool = True, timeline: bool = True,
            show: bool | None = None, record: bool = True) -> _Profile:
    """``with gpunb.profile() as p:`` measures the block like ``%%gpuprofile`` measures a cell.

    After the block ``p.result`` is the ``CellProfile`` (``p`` itself displays it, and
    ``p.to_dict()`` gives plain data). An exception in the block is recorded and then
    propagates unchanged. Options: ``warmup_steps`` (steps left out of median/p90),
    ``reset_peak`` (reset torch's global peak-memory counter; False leaves it untouched),
    ``timeline`` (memory points at most every 200 ms at step ends), ``label``, ``show``
    (display the report when the block ends; default: when running in IPython/Jupyter),
    ``record`` (add it to ``%gpuprofile history``; without the extension loaded, to the
    history ``%load_ext gpunb`` takes over).
    """
    history = kernel_state().profile_history if record else None
    return _Profile(label, warmup_steps=warmup_steps, reset_peak=reset_peak, timeline=timeline, show=show,
                    history=history)
