"""Does it grow with every step? A robust slope over several looks, and the thresholds.

A holder grows when, over at least :data:`MIN_LOOKS` looks after the warm-up spanning at least
:data:`MIN_STEPS` steps, its count never fell, rose in most intervals (the last one too) and the
Theil-Sen slope (the median of the slopes between every two looks, so one odd look cannot make
or hide a trend) is positive. First-versus-last is not enough: a cache filled once in the first
steps, then left alone, rises once and stays flat; a bounded buffer (``deque(maxlen=100)``)
stops rising.

What is reported:

- tensors with autograd history that pile up (each keeps its step's graph: nodes on the host
  and, when ``.backward()`` did not run on it, the activations), and a tensor whose graph gains
  nodes every step (``total_loss += loss``): always, whatever their bytes;
- detached tensors that pile up: when they add at least :data:`MIN_BYTES_PER_STEP` per step AND
  :data:`HORIZON_STEPS` more steps at that rate would add at least :data:`MIN_SHARE` of the
  memory in use. A list of detached scalars (4 bytes a step: 40 kB after 10,000 steps) stays
  silent; a cache of batches (hundreds of KiB a step) does not.
- GPU memory (torch's allocated bytes, never reserved: the caching allocator keeps freed
  blocks, so reserved bytes rise and plateau in a healthy loop) that grows by the same rule
  with no holder found in the notebook's variables.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

MIN_LOOKS = 4  # looks after the warm-up, the end of the cell included
MIN_STEPS = 6  # steps between the first and the last look
MIN_BYTES_PER_STEP = 1024  # 256 float32 values: more than the few scalars a loop logs per step
HORIZON_STEPS = 10_000  # "a long run": a leak that would not matter within it is not reported
MIN_SHARE = 0.01  # ... of the memory in use, added over the horizon


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The median slope between every two points (Theil-Sen), robust to a few odd points."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]
    return statistics.median(slopes) if slopes else 0.0


def steady_rise(xs: Sequence[float], ys: Sequence[float]) -> bool:
    """Grows with the steps: enough looks over enough steps, never falling, rising in most
    intervals and in the last one, with a positive median slope."""
    if len(xs) < MIN_LOOKS or xs[-1] - xs[0] < MIN_STEPS:
        return False
    steps = list(itertools.pairwise(ys))
    if any(b < a for a, b in steps) or steps[-1][1] <= steps[-1][0]:
        return False
    rises = sum(b > a for a, b in steps)
    return rises * 4 >= len(steps) * 3 and theil_sen(xs, ys) > 0


def rose(xs: Sequence[float], ys: Sequence[float]) -> bool:
    """Rose across fewer looks than :func:`steady_rise` needs: never falling, rising in the last
    interval and overall. Used only to name the holder of GPU memory whose steady rise the
    allocated bytes at every step end already showed (a look that costs more than the budget
    allows, a list of activations walked at each look, leaves too few looks to judge alone)."""
    if len(xs) < 2 or ys[0] <= 0 or ys[-1] <= ys[0]:  # held something at the first look (not a new element)
        return False
    steps = list(itertools.pairwise(ys))
    return not any(b < a for a, b in steps) and steps[-1][1] > steps[-1][0]


def matters(bytes_per_step: float, memory_in_use: int) -> bool:
    """Detached growth worth a word: see the module's docstring."""
    return (bytes_per_step >= MIN_BYTES_PER_STEP
            and bytes_per_step * HORIZON_STEPS >= MIN_SHARE * max(memory_in_use, 1))
