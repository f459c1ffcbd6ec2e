"""The finding and its fix, in words about the user's own code, per pattern:

- ``all_preds.append(logits)``: "`all_preds` holds 60 tensors with autograd history" — append
  ``logits.detach()``, or ``logits.item()`` for a number;
- ``total_loss += loss``: "`total_loss` keeps the autograd graph of every step" — add ``loss.item()``;
- ``cache[i] = x``: "`cache` holds 60 tensors" — bound it, or keep summaries;
- ``acc = torch.cat([acc, out])``: "`acc` grows every step" (one tensor, more bytes each step) —
  ``torch.cat`` once after the loop;
- a forward hook that stores its output (in a closure, a bound object, or a notebook list the
  hook appends to): named with the module it hangs on — store ``output.detach()``.

The appended variable is recognised when one of the notebook's tensor variables looks like the
held tensors (same shape, dtype and kind of autograd node) or feeds the growing graph.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpunb.analysis import reach
from gpunb.analysis.leaks.snapshot import Snapshot

_HOOK = re.compile(r"^(?P<module>.*?)\.<(?P<kind>[a-z -]+hook) (?P<fn>.*?)>(?:\.(?P<var>.*))?$")


def _code(name: str) -> str:
    return f"`{name}`"


def hook_words(holder: str) -> str | None:
    """``model.fc1.<forward hook save>.store`` -> "`store` of the forward hook `save` on `model.fc1`"."""
    m = _HOOK.match(holder)
    if m is None:
        return None
    on = f"the {m['kind']} {_code(m['fn'])} on {_code(m['module'])}"
    return f"{_code(m['var'])} of {on}" if m["var"] else on


def hooks_filling(namespace: Mapping[str, Any], torch: Any, holder: str) -> str | None:
    """The hook that appends to a notebook variable by its global name (``acts.append(out)`` in a
    hook defined in the notebook), as "the forward hook `save` on `model.fc1`"; None if none.
    The hooks are those the walk names (:func:`gpunb.analysis.reach.module_attributes`)."""
    name = re.split(r"[.\[]", holder, maxsplit=1)[0]
    module_type = getattr(getattr(torch, "nn", None), "Module", None)
    if module_type is None:
        return None
    for var, value in list(namespace.items()):
        try:
            if not isinstance(var, str) or var.startswith("_") or not isinstance(value, module_type):
                continue
            for path, hook in reach.module_attributes(value, var):
                m = _HOOK.match(path)
                if m is None or m["var"]:
                    continue
                fn = getattr(hook, "__func__", hook)
                code = getattr(fn, "__code__", None)
                if code is not None and (name in set(reach.global_names(code)) or _closes_over(fn, namespace, name)):
                    return f"the {m['kind']} {_code(m['fn'])} on {_code(m['module'])}"
        except BaseException as exc:  # noqa: BLE001 (CancelledError too); the finding stands without it
            if reach.passes(exc):
                raise
            continue
    return None


def _closes_over(fn: Any, namespace: Mapping[str, Any], name: str) -> bool:
    """Whether ``fn`` holds the variable ``name`` itself in its closure (a hook defined in a function,
    appending to that function's list), not only a global of that name."""
    if name not in namespace:
        return False
    held = namespace[name]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            if cell.cell_contents is held:
                return True
        except ValueError:  # an empty cell: a variable not yet bound
            continue
    return False


def appended_variable(holder: str, last: Snapshot) -> str | None:
    """The notebook variable whose tensors pile up in ``holder`` (same shape, dtype and autograd
    node kind as the held ones), when exactly one fits."""
    held = last.holdings.get(holder)
    if held is None or not held.sample:
        return None
    top = re.split(r"[.\[]", holder, maxsplit=1)[0]
    fits = [name for name, (sample, _) in last.variables.items() if sample == held.sample and name != top]
    return fits[0] if len(fits) == 1 else None


def graph_feeder(holder: str, last: Snapshot) -> str | None:
    """The variable added into a growing graph (``loss`` in ``total_loss += loss``)."""
    held = last.holdings.get(holder)
    if held is None or not held.graph_inputs:
        return None
    fits = [name for name, (_, fn) in last.variables.items() if fn and fn in held.graph_inputs and name != holder]
    if not fits:  # at a step's end this step's `loss` is not added yet: the same kind of tensor
        fits = [name for name, (sample, fn) in last.variables.items()
                if fn and name != holder and sample[2] in held.graph_input_kinds and sample[2] != held.sample[2]
                and sample[:2] == held.sample[:2]]
    return fits[0] if len(fits) == 1 else None


def describe(pattern: str, holder: str, tensors: int, nodes: int, nodes_per_step: float, last: Snapshot,
             filled_by: str | None) -> tuple[str, str]:
    """(the finding, the fix) for one growing holder."""
    via_hook = hook_words(holder)
    who = via_hook or _code(holder)
    if filled_by:
        who += f", filled by {filled_by}"
    plural = "s" if tensors != 1 else ""
    if pattern == "graph":
        feeder = graph_feeder(holder, last)
        sentence = (f"{who} keeps the autograd graph of every step ({nodes:,} nodes, "
                    f"+{nodes_per_step:.0f} per step)")
        fix = (f"add `{feeder}.item()`, a Python number, instead of `{feeder}`" if feeder
               else "add each step's `.item()`, a Python number, or its `.detach()`")
        return sentence, fix
    if pattern == "history":
        sentence = f"{who} holds {tensors:,} tensor{plural} with autograd history"
        if via_hook or filled_by:
            return sentence, "store `output.detach()` in the hook, and `handle.remove()` the hook when done"
        var = appended_variable(holder, last)
        if var:
            return sentence, f"append `{var}.detach()`, or `{var}.item()` for a number"
        return sentence, "store each tensor's `.detach()`, or its `.item()` for a number"
    if pattern == "bytes":
        sentence = f"{who} grows every step ({tensors:,} tensor{plural}, more bytes at each step)"
        return sentence, ("collect the pieces in a list and `torch.cat` them once after the loop, or keep a "
                          "running summary (a sum, a mean) instead of every value")
    sentence = f"{who} holds {tensors:,} tensor{plural}, one more set every step"
    if via_hook or filled_by:
        return sentence, "keep what the hook stores bounded, or `handle.remove()` the hook when done"
    return sentence, "keep it bounded (drop old entries) or keep summaries such as `x.mean().item()`"
