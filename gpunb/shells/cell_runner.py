"""Run a cell magic's body as IPython runs a cell: named ``In [n]`` (tracebacks, allocation stacks
and linecache agree), the last expression's value returned as the cell's result, an error shown
from the user's first frame and marked on the cell's result (so ``post_run_cell`` hooks, the OOM
doctor among them, and nbclient see the cell as failed)."""

from __future__ import annotations

import ast
import sys
from typing import Any


def compile_cell(shell: Any, cell: str, number: int | None) -> tuple[Any, Any]:
    """(the body's code, its last expression's code or None). A leading newline keeps the line
    numbers the user sees (line 1 holds the magic)."""
    source = "\n" + shell.transform_cell(cell)
    name = shell.compile.cache(source, number or 0, raw_code="\n" + cell)
    tree = ast.parse(source, filename=name)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = shell.compile(ast.Expression(tree.body.pop().value), name, "eval")
    return shell.compile(tree, name, "exec"), last


def run_compiled(shell: Any, code: Any, last_expr: Any) -> tuple[Any, BaseException | None]:
    """(value, error): the error is returned, not raised; its traceback starts at this frame."""
    glob, loc = shell.user_global_ns, shell.user_ns
    try:
        exec(code, glob, loc)
        return (eval(last_expr, glob, loc) if last_expr is not None else None), None
    except BaseException as exc:  # noqa: BLE001 (shown as IPython would by finish())
        return None, exc


def mark_failed(shell: Any, error: BaseException | None = None, before_exec: bool = False) -> None:
    result = getattr(shell.displayhook, "exec_result", None)
    if result is None:
        return
    if before_exec:
        result.error_before_exec = sys.exc_info()[1] or result.error_before_exec
    else:
        result.error_in_exec = error


def finish(shell: Any, value: Any, error: BaseException | None, cell: str) -> Any:
    """The cell's result as IPython would give it: the traceback shown (from the user's frame on),
    ``SystemExit`` re-raised, a trailing ``;`` silencing the value."""
    if error is not None:
        if isinstance(error, SystemExit):
            raise error
        tb = error.__traceback__.tb_next if error.__traceback__ is not None else None
        shell.showtraceback((type(error), error, tb or error.__traceback__), tb_offset=0)
        mark_failed(shell, error=error)
        return None
    if cell.rstrip().endswith(";"):
        return None
    return value
