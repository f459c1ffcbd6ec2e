"""Source of the hostile namespace objects the robustness and fault-injection tests define in
a shell (run there as a cell, so they are the user's objects, not imported ones)."""

UNBOUND_PROXY = '''
from contextvars import ContextVar

class UnboundProxy:
    """Like werkzeug's LocalProxy(ContextVar('u')) before anything is bound."""
    def __init__(self, var):
        object.__setattr__(self, "_var", var)
    def _get(self):
        try:
            return self._var.get()
        except LookupError:
            raise RuntimeError("object is not bound") from None
    @property
    def __class__(self):
        return type(self._get())
    @property
    def __dict__(self):
        return self._get().__dict__
    def __getattr__(self, name):
        return getattr(self._get(), name)
    def __iter__(self):
        return iter(self._get())
    def __len__(self):
        return len(self._get())
    def __repr__(self):
        return repr(self._get())
    def __eq__(self, other):
        return self._get() == other
    __hash__ = None
'''
