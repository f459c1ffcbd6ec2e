"""Which line of the user's code made an allocation: torch's recorded Python stack, folded.

A frame of torch's allocation history is ``{"filename", "line", "name"}``, innermost first
(``torch/cuda/_memory_viz.py`` reverses them to draw flame graphs from the outermost). The
frames inside torch, other installed packages, the standard library, IPython and gpunb are
folded away; what stays is the user's code: notebook cells (named ``In [12]`` through the
shell's map of cell file names, passed in as ``cell_numbers``) and the user's own module files.
The site of an allocation is its innermost user frame, the line that asked for the memory
(``In [12] line 7: h = self.fc1(x)``); the outer user frames stay as its stack.
"""

from __future__ import annotations

import linecache
import os
import re
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# An allocation with no Python frame was made by a thread without Python: on CUDA that is
# autograd's device thread running the backward pass.
NO_PYTHON = "the backward pass or another C++ thread (no Python stack)"
BEFORE_CELL = "allocated before this cell"

_SHELL_PACKAGES = frozenset({"IPython", "ipykernel", "jupyter_client", "traitlets", "tornado", "zmq", "debugpy"})
_MAGIC_CALL = "get_ipython().run_cell_magic("
_OLD_CELL = re.compile(r"^<ipython-input-(\d+)-[0-9a-f]+>$")  # IPython < 8.0


@dataclass(frozen=True)
class UserFrame:
    where: str  # "In [12] line 7", "train.py line 30"
    code: str  # the source line, stripped ("" when not known)
    function: str
    path: str  # the file as torch recorded it

    @property
    def label(self) -> str:
        return f"{self.where}: {self.code}" if self.code else f"{self.where} in {self.function}"


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.add(str(Path(__file__).resolve().parents[2]))  # gpunb itself
    return tuple(sorted(r.rstrip(os.sep) + os.sep for r in roots if r))


_ROOTS = _library_roots()


def is_library(path: str, cell_numbers: Mapping[str, int]) -> bool:
    """Folded away: torch, installed packages, the standard library, gpunb, frozen/generated code."""
    if path in cell_numbers or _OLD_CELL.match(path):
        return False
    if path.startswith("<") or not path:
        return True
    if os.sep + "site-packages" + os.sep in path or os.sep + "dist-packages" + os.sep in path:
        return True
    if _SHELL_PACKAGES.intersection(path.split(os.sep)):  # the shell, installed anywhere (pip --target)
        return True
    return path.startswith(_ROOTS)


def cell_number(path: str, cell_numbers: Mapping[str, int]) -> int | None:
    number = cell_numbers.get(path)
    if number is not None:
        return number
    old = _OLD_CELL.match(path)
    return int(old.group(1)) if old else None


def user_frame(frame: Mapping[str, Any], cell_numbers: Mapping[str, int]) -> UserFrame | None:
    """The frame as the user's line, or None when it is library code."""
    path = str(frame.get("filename", ""))
    if is_library(path, cell_numbers):
        return None
    line = frame.get("line", 0)
    line = line if isinstance(line, int) else 0
    number = cell_number(path, cell_numbers)
    where = f"In [{number}] line {line}" if number is not None else f"{os.path.basename(path)} line {line}"
    code = linecache.getline(path, line).strip() if line > 0 else ""
    if code.startswith(_MAGIC_CALL):  # the cell a cell magic's body runs from: IPython's, not the user's line
        return None
    return UserFrame(where, code[:120], str(frame.get("name", "")), path)


def user_frames(frames: Sequence[Mapping[str, Any]] | None, cell_numbers: Mapping[str, int]) -> list[UserFrame]:
    """The user's frames of one stack, innermost first. Frames outside the outermost notebook
    cell are the shell running it (IPython, ipykernel, a script driving them): not the user's."""
    frames = list(frames or ())
    cells = [i for i, f in enumerate(frames) if isinstance(f, Mapping)
             and cell_number(str(f.get("filename", "")), cell_numbers) is not None]
    if cells:
        frames = frames[: cells[-1] + 1]
    out = []
    for frame in frames:
        if isinstance(frame, Mapping):
            uf = user_frame(frame, cell_numbers)
            if uf is not None:
                out.append(uf)
    return out


def innermost_library(frames: Sequence[Mapping[str, Any]] | None) -> str:
    """Where in library code an allocation with no user frame came from: ``torch/optim/adam.py: _init_group``."""
    for frame in frames or ():
        path = str(frame.get("filename", ""))
        if "site-packages" in path:
            path = path.split("site-packages" + os.sep, 1)[1]
        if path:
            return f"{path}: {frame.get('name', '')}"
    return NO_PYTHON


def site_of(frames: Sequence[Mapping[str, Any]] | None, cell_numbers: Mapping[str, int]) -> tuple[str, tuple[str, ...]]:
    """(the site's label, the user's stack outermost first): the innermost user frame names it;
    without one, the innermost library frame, marked as not the user's."""
    mine = user_frames(frames, cell_numbers)
    if mine:
        return mine[0].label, tuple(f.label for f in reversed(mine))
    if not frames:
        return NO_PYTHON, ()
    return f"no line of yours: {innermost_library(frames)}", ()


def shell_cell_numbers(compiler: Any) -> dict[str, int]:
    """IPython's map of the file names it compiles cells under to their ``In [n]`` numbers
    (``CachingCompiler._filename_map``, IPython 8 and 9; ipykernel's ``/tmp/ipykernel_*/…py``
    names are in it too). Empty when the shell has none."""
    names = getattr(compiler, "_filename_map", None)
    if not isinstance(names, dict):
        return {}
    return {k: v for k, v in names.items() if isinstance(k, str) and isinstance(v, int)}
