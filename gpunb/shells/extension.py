"""Load and unload of the IPython extension: every registration has its undo.

Each feature lives in its own shell module with ``register(ip, state)``; it registers
magics, cell events and things to stop through :class:`ExtensionState`, which undoes
all of it on ``%unload_ext`` / ``%reload_ext``. What the features keep between cells
(the sampler, monitors, profiled cells, OOM doctor settings) is the extension's typed
:class:`~gpunb.shells.kernel_state.KernelState`, ``state.kernel``.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from gpunb.shells.kernel_state import STANDALONE_STATE, KernelState
from gpunb.shells.session import current_shell

# Shell modules, each with ``register(ip, state)``.
FEATURES: tuple[str, ...] = (
    "gpunb.shells.check_magic",
    "gpunb.shells.monitor_magic",
    "gpunb.shells.profile_magic",
    "gpunb.shells.oom_hook",
    "gpunb.shells.mem_magic",
    "gpunb.shells.fit_magic",
    "gpunb.shells.plan_magic",
    "gpunb.shells.energy_magic",
)

_STATE_ATTR = "_gpunb_extension_state"


class ExtensionState:
    """What the extension registered on one shell, so unload can take it all back."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._magic_names: list[tuple[str, str]] = []  # (kind, name)
        self._magic_classes: list[str] = []
        self._magic_objects: list[Any] = []
        self._events: list[tuple[str, Callable]] = []
        self._on_unload: list[Callable[[], None]] = []
        self.kernel = KernelState()

    def add_magics(self, magics: Any) -> None:
        self.shell.register_magics(magics)
        for kind, table in magics.magics.items():
            self._magic_names.extend((kind, name) for name in table)
        self._magic_classes.append(type(magics).__name__)
        self._magic_objects.append(magics)  # Magics.__init__ also put it in shell.configurables

    def on(self, event: str, callback: Callable) -> None:
        self.shell.events.register(event, callback)
        self._events.append((event, callback))

    def on_unload(self, fn: Callable[[], None]) -> None:
        self._on_unload.append(fn)

    def undo(self) -> None:
        for fn in reversed(self._on_unload):
            try:
                fn()
            except Exception as exc:  # unload must finish whatever one feature does
                print(f"gpunb: error while unloading: {exc!r}")
        for event, callback in self._events:
            try:
                self.shell.events.unregister(event, callback)
            except ValueError:
                pass
        manager = self.shell.magics_manager
        for kind, name in self._magic_names:
            manager.magics[kind].pop(name, None)
        for cls in self._magic_classes:
            manager.registry.pop(cls, None)
        configurables = getattr(self.shell, "configurables", None)
        if isinstance(configurables, list):  # else every load/unload left its Magics objects there
            configurables[:] = [c for c in configurables if not any(c is m for m in self._magic_objects)]
        self._on_unload.clear()
        self._events.clear()
        self._magic_names.clear()
        self._magic_objects.clear()


def state_of(shell: Any) -> ExtensionState | None:
    return getattr(shell, _STATE_ATTR, None)


def kernel_state(shell: Any = None) -> KernelState:
    """What gpunb keeps for ``shell`` (default: the current one): the extension's state when
    it is loaded there, else :data:`~gpunb.shells.kernel_state.STANDALONE_STATE`."""
    shell = shell if shell is not None else current_shell()
    extension = state_of(shell) if shell is not None else None
    return extension.kernel if extension is not None else STANDALONE_STATE


def load(shell: Any) -> None:
    if state_of(shell) is not None:  # loading twice must not double hooks or threads
        unload(shell)
    state = ExtensionState(shell)
    state.kernel.take_over(STANDALONE_STATE)  # a monitor or profiled cells from before %load_ext
    setattr(shell, _STATE_ATTR, state)
    for module in FEATURES:
        import_module(module).register(shell, state)


def unload(shell: Any) -> None:
    state = state_of(shell)
    if state is None:
        return
    state.undo()
    delattr(shell, _STATE_ATTR)
    # Threads and monitors were stopped above; the profiled cells are data the API twins
    # keep using without the extension, and a reload takes them back.
    STANDALONE_STATE.take_over(state.kernel)
