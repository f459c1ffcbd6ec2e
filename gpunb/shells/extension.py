"""Load and unload of the IPython extension: every registration has its undo.

Each feature lives in its own shell module with ``register(ip, state)``; it registers
magics, cell events and things to stop through :class:`ExtensionState`, which undoes
all of it on ``%unload_ext`` / ``%reload_ext``. What the features keep between cells
(the sampler, monitors, profiled cells, OOM doctor settings) is the extension's typed
:class:`~gpunb.shells.kernel_state.KernelState`, ``state.kernel``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from importlib import import_module
from typing import Any

from gpunb.readings.transaction import Transaction, close_all
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
    """What the extension registered on one shell, so unload can take it all back: one
    :class:`~gpunb.readings.transaction.Transaction`, each registration's undo registered
    before it."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._transaction = Transaction("gpunb extension")
        self.kernel = KernelState()

    def add_magics(self, magics: Any) -> None:
        self._transaction.switch(lambda: self.shell.register_magics(magics),
                                 partial(_remove_magics, self.shell, magics))

    def on(self, event: str, callback: Callable) -> None:
        self._transaction.switch(lambda: self.shell.events.register(event, callback),
                                 partial(_unregister, self.shell, event, callback))

    def on_unload(self, fn: Callable[[], None]) -> None:
        self._transaction.add(partial(_reported, fn))

    def undo(self) -> None:
        """Take everything back, newest first; then close any transaction of gpunb's a Ctrl-C
        left open (a hook, torch's allocation history, an environment entry)."""
        try:
            self._transaction.close()
        finally:
            close_all()


def _reported(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # unload must finish whatever one feature does
        print(f"gpunb: error while unloading: {exc!r}")


def _unregister(shell: Any, event: str, callback: Callable) -> None:
    try:
        shell.events.unregister(event, callback)
    except ValueError:  # not registered (its register was cut off)
        pass


def _remove_magics(shell: Any, magics: Any) -> None:
    manager = shell.magics_manager
    for kind, table in magics.magics.items():
        for name in table:
            if getattr(manager.magics[kind].get(name), "__self__", None) is magics:  # not a later one's
                manager.magics[kind].pop(name, None)
    if manager.registry.get(type(magics).__name__) is magics:
        manager.registry.pop(type(magics).__name__, None)
    configurables = getattr(shell, "configurables", None)
    if isinstance(configurables, list):  # else every load/unload left its Magics objects there
        configurables[:] = [c for c in configurables if c is not magics]


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
    from gpunb.shells.widget_channel import close_controls_subshell

    close_controls_subshell(getattr(shell, "kernel", None))  # its thread ends with gpunb
    # Threads and monitors were stopped above; the profiled cells are data the API twins
    # keep using without the extension, and a reload takes them back.
    STANDALONE_STATE.take_over(state.kernel)
