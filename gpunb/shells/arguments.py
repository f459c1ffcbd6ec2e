"""Magic argument parsing shared by every gpunb magic."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring


def parse_args(magic: Any, line: str) -> Any:
    """Parse a magic's declared arguments; a bad flag becomes a UsageError that carries the
    usage line (IPython shows UsageErrors as a message, without a traceback)."""
    try:
        return parse_argstring(magic, line)
    except UsageError as exc:
        usage = " ".join(magic.parser.format_usage().replace("::", "").split())
        raise UsageError(f"{exc}\n{usage}\n(see `%{magic.__name__}?` for help)") from None
