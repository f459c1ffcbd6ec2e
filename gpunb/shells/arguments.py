"""Magic arguments, declared and checked in one place for every gpunb magic.

Each magic declares its options with IPython's ``@argument`` and the value types below
(whole numbers and decimals with their allowed range, a variable name for ``-o``, a CUDA
device). Every bad argument becomes IPython's ``UsageError``: IPython shows it as a
message without a traceback, and the cell *fails*, so a notebook run by nbclient or CI
stops instead of carrying on as if the magic had done its work. The message names the
bad value, what is allowed, the usage line and ``%magic?``.
"""

from __future__ import annotations

import argparse
import builtins
import difflib
import keyword
import math
import re
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, parse_argstring
from IPython.utils.process import arg_split

# Names IPython itself keeps in the notebook namespace and rewrites after every cell
# (the input/output history and its shortcuts): a result bound there would be lost.
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit"})
_IPYTHON_HISTORY_NAME = re.compile(r"_(|_|__|i|ii|iii|ih|oh|dh|\d+|i\d+)")


def _allowed(low: float | None, high: float | None, high_open: bool = False) -> str:
    """The allowed range in words: "1 or more", "from 0.5 to 10", "from 0 to below 0.9"."""
    if low is not None and high is not None:
        return f"from {low:g} to {'below ' if high_open else ''}{high:g}"
    if low is not None:
        return f"{low:g} or more"
    if high is not None:
        return f"below {high:g}" if high_open else f"{high:g} or less"
    return "any number"


def whole_number(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer within [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number (allowed: {_allowed(low, high)})") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range (allowed: {_allowed(low, high)})")
        return value

    parse.__name__ = "whole number"
    return parse


def decimal(low: float | None = None, high: float | None = None, *, high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number within [low, high] (or [low, high) with ``high_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number (allowed: {_allowed(low, high, high_open)})")
        too_high = high is not None and (value >= high if high_open else value > high)
        if (low is not None and value < low) or too_high:
            raise argparse.ArgumentTypeError(
                f"{value:g} is out of range (allowed: {_allowed(low, high, high_open)})")
        return value

    parse.__name__ = "number"
    return parse


def variable_name(text: str) -> str:
    """An argparse type for ``-o NAME``: a name the result can be bound to in the notebook
    without silently taking something away (a keyword, a built-in, IPython's history)."""
    if not text.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python variable name")
    if keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a Python keyword, not a variable name")
    if text in _IPYTHON_NAMES or _IPYTHON_HISTORY_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is IPython's own (input/output history); choose another name")
    if hasattr(builtins, text):
        raise argparse.ArgumentTypeError(
            f"{text!r} would hide Python's built-in {text}; choose another name")
    return text


def free_text(value: str) -> str:
    """An argparse type for free text: IPython splits magic lines keeping the quotes
    (``--label "big batch"`` arrives as ``"big batch"``), so one enclosing pair is dropped."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def cuda_device(text: str) -> str:
    """An argparse type: ``cuda``, ``cuda:N`` or ``N`` (a CUDA device index), as ``cuda[:N]``."""
    match = re.fullmatch(r"(?:cuda:)?(\d+)|cuda", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a CUDA device (allowed: cuda, cuda:N or N, with N a device index)")
    return f"cuda:{int(match.group(1))}" if match.group(1) is not None else "cuda"


def output_option(what: str) -> Callable[[Any], Any]:
    """The ``-o NAME`` option every magic has: bind its result object to NAME."""
    return argument("-o", "--output", dest="output", type=variable_name, default=None, metavar="NAME",
                    help=f"also bind {what} to NAME in the notebook")


def usage_error(magic: Any, problem: str) -> UsageError:
    """A UsageError that says what is wrong, the magic's usage line and where its help is."""
    name = getattr(magic, "__name__", "magic")
    usage = " ".join(magic.parser.format_usage().replace("::", "").split())
    return UsageError(f"%{name}: {problem}\nusage: {usage}\nSee %{name}? for every option.")


HELP_FLAGS = ("-h", "--help")


def parse_args(magic: Any, line: str) -> argparse.Namespace | None:
    """Parse a magic's declared arguments; anything bad raises a UsageError (see module doc).

    ``-h``/``--help`` anywhere on the line prints the magic's help (what ``%magic?`` shows)
    and returns None: the caller then does nothing else.
    """
    try:
        words = arg_split(line, strict=True)
    except ValueError as exc:  # the line itself does not split (an unclosed quote)
        raise usage_error(magic, f"cannot read the arguments ({exc})") from None
    if any(word in HELP_FLAGS for word in words):
        print(help_text(magic))
        return None
    _refuse_opposites(magic, words)
    _refuse_unknown_options(magic, words)
    try:
        return parse_argstring(magic, line)
    except UsageError as exc:
        raise usage_error(magic, _plain(magic, str(exc))) from None


def help_text(magic: Any) -> str:
    """The magic's usage, what it does and every option: the text ``%magic?`` shows, without
    the reStructuredText ``::`` that IPython puts before the usage line."""
    return re.sub(r"^::\s*\n", "", magic.parser.format_help().lstrip()).rstrip() + "\n"


def _refuse_opposites(magic: Any, words: list[str]) -> None:
    """Two options that set one value (``--timeline`` and ``--no-timeline``) exclude each
    other; argparse would quietly keep the last one."""
    seen: dict[str, str] = {}
    for word in words:
        option = word.split("=", 1)[0]
        action = magic.parser._option_string_actions.get(option)
        if action is None:
            continue
        other = seen.get(action.dest)
        if other is not None and other not in action.option_strings:
            raise usage_error(magic, f"{other} and {option} exclude each other: give one of them")
        seen[action.dest] = option


def _refuse_unknown_options(magic: Any, words: list[str]) -> None:
    """An option the magic does not have is named before argparse parses the line: argparse
    would otherwise hand its value to a positional and complain about that instead
    (``--stpes 3`` read as "invalid choice: '3'")."""
    known = magic.parser._option_string_actions
    for word in words:
        if word == "--":
            return
        option = word.split("=", 1)[0]
        if not re.fullmatch(r"--?[A-Za-z][\w-]*", option) or option in known:
            continue
        if option.startswith("--") and sum(o.startswith(option) for o in known) == 1:
            continue  # argparse's own unambiguous abbreviation (--quic for --quick)
        raise usage_error(magic, unknown_option(option, known))


def unknown_option(option: str, known: Any) -> str:
    """"unknown option --stpes: did you mean --steps?" (compared without the dashes, which
    every option shares and which would make any word look close)."""
    options = {o.lstrip("-"): o for o in known if o.startswith("--")}
    close = difflib.get_close_matches(option.lstrip("-"), list(options), n=1, cutoff=0.65)
    return f"unknown option {option}: did you mean {options[close[0]]}?" if close else \
        f"unrecognized arguments: {option}"  # argparse's own words, where there is nothing to suggest


def _plain(magic: Any, message: str) -> str:
    """argparse's message in the magic's words: the option alone (not "argument --steps:"),
    a "did you mean" for a misspelt option or choice, a missing STEP said as what to pass."""
    message = re.sub(r"^argument ", "", message)
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    if unknown:
        # Compared without the dashes, which every option shares and which would make
        # any word look close.
        options = {o.lstrip("-"): o for o in magic.parser._option_string_actions if o.startswith("--")}
        hints = []
        for word in arg_split(unknown.group(1)):
            close = difflib.get_close_matches(word.split("=", 1)[0].lstrip("-"), list(options), n=1, cutoff=0.65)
            if close and word.startswith("-"):
                hints.append(f"unknown option {word}: did you mean {options[close[0]]}?")
        if hints:
            message = "; ".join(hints)
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        allowed = re.findall(r"'([^']*)'", choice.group(2))
        close = difflib.get_close_matches(choice.group(1), allowed, n=1, cutoff=0.6)
        if close:
            message += f" — did you mean {close[0]}?"
    missing = re.match(r"the following arguments are required: (.*)", message)
    if missing:  # say what to pass, from the argument's own help
        wanted = [a for a in magic.parser._actions if not a.option_strings and (a.metavar or a.dest)
                  in missing.group(1).split(", ")]
        message = "; ".join(f"missing {a.metavar or a.dest}: {_lower_first((a.help or '').rstrip('.'))}"
                            for a in wanted)
    return message


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def given(magic: Any, args: argparse.Namespace, *names: str) -> list[str]:
    """Of the options ``names`` (their ``dest``), those set to something other than their default."""
    return [name for name in names if getattr(args, name, None) != magic.parser.get_default(name)]


def option_words(names: list[str]) -> str:
    """Attribute names as the user typed them: ``no_reset`` -> ``--no-reset``."""
    return ", ".join("-o" if n == "output" else "--" + n.replace("_", "-") for n in names)
