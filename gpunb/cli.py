"""``gpunb check`` in a terminal: the same checklist for people not in a notebook yet.

Exit status: 0 no check failed (warnings allowed), 1 a check failed, 2 bad arguments,
3 gpunb itself failed (a bug), 4 the report could not be written (standard output closed or
on a full device: one line on stderr). Under ``--json`` every outcome but 4 prints a JSON
object on stdout; 2 and 3 with an ``error`` key.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import traceback
from typing import Any

from gpunb._version import __version__

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_CRASH, EXIT_OUTPUT = 0, 1, 2, 3, 4
ISSUES_HINT = "Please report it to the gpunb maintainers with this message and `gpunb --version`."


class _UsageProblem(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is raised (main prints it as text or JSON) instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageProblem(self, _did_you_mean(self, message))


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's "unrecognized arguments: --quik" with the option meant (--quick)."""
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    if not unknown:
        return message
    options = [o for p in _parsers(parser) for o in p._option_string_actions if o.startswith("--")]
    hints = []
    for word in unknown.group(1).split():
        close = difflib.get_close_matches(word.split("=", 1)[0].lstrip("-"), [o[2:] for o in options],
                                          n=1, cutoff=0.65) if word.startswith("--") else []
        if close:
            hints.append(f"unknown option {word}: did you mean --{close[0]}?")
    return "; ".join(hints) or message


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and its subcommands' (the unknown option belongs to one of them)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [parser, *(p for a in subs for p in a.choices.values())]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpunb",
                                     description="GPU training setup checks (the terminal side of gpunb).")
    parser.add_argument("--version", action="version", version=f"gpunb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = sub.add_parser("check", help="run the setup checklist; exit code 1 if a check fails",
                           description="Run the GPU training setup checklist. Exit status: 0 when no check "
                                       "fails (warnings allowed), 1 when one fails, 2 on bad arguments, 3 when "
                                       "gpunb itself failed (a bug; with --json the output is a JSON object "
                                       "with an \"error\" key).")
    check.add_argument("--quick", action="store_true", help="skip the CUDA smoke test, matmul and copy measurements")
    check.add_argument("--deep", action="store_true",
                       help="also an NCCL all-reduce across every GPU (subprocesses, killed after 90 s)")
    check.add_argument("--device", type=int, metavar="N", help="check only cuda:N")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--require-gpu", action="store_true",
                       help="fail (exit 1) on a machine without an NVIDIA GPU; by default such a machine "
                            "skips the GPU checks and exits 0")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser.parse_args(argv)
    except _UsageProblem as problem:  # usage on stderr as argparse does; under --json the JSON too
        return _usage(problem.parser, str(problem), as_json="--json" in argv)
    if args.command != "check":
        parser.print_help()
        return EXIT_USAGE
    try:
        return _check(args)
    except Exception as exc:  # a bug of gpunb: say so in the output's own format, never a traceback
        return _crashed(exc, as_json=args.json)


def _usage(parser: argparse.ArgumentParser, message: str, *, as_json: bool) -> int:
    if as_json and not _emit(json.dumps({"ok": False, "error": {
            "type": "usage", "message": message, "cause": "the command line has a bad argument",
            "fix": f"see `{parser.prog} --help`"}}, indent=2)):
        return EXIT_OUTPUT
    parser.print_usage(sys.stderr)
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _emit(text: str) -> bool:
    """Write the report to stdout; on a full device or a closed pipe say so in one line on
    stderr (not a traceback) and return False."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except OSError as exc:
        try:  # the interpreter flushes stdout once more at exit: let that go nowhere
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        why = exc.strerror or type(exc).__name__
        print(f"gpunb check: could not write the report to standard output ({why}); "
              "free space on that device or write it elsewhere (`gpunb check --json > file`).", file=sys.stderr)
        return False
    return True


def _check(args: argparse.Namespace) -> int:
    from gpunb.analysis.checks.checklist import CheckOptionError, check

    def progress(partial) -> None:
        if partial.in_progress and sys.stderr.isatty():
            print(f"gpunb check: {partial.in_progress}", file=sys.stderr, flush=True)

    try:
        report = check(quick=args.quick, device=args.device, deep=args.deep, progress=progress, in_kernel=False,
                       require_gpu=args.require_gpu)
    except CheckOptionError as exc:
        if args.json and not _emit(json.dumps({"ok": False, "error": {
                "type": "usage", "message": str(exc), "cause": "these options exclude each other",
                "fix": "see `gpunb check --help`"}}, indent=2)):
            return EXIT_OUTPUT
        print(f"gpunb check: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not _emit(report.to_json() if args.json else str(report)):
        return EXIT_OUTPUT
    return exit_code(report)


def exit_code(report: Any) -> int:
    """The exit status a finished check run gives: the record's own verdict (``report.ok``)."""
    return EXIT_OK if report.ok else EXIT_CHECK_FAILED


def _crashed(exc: Exception, *, as_json: bool) -> int:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    try:
        message = str(exc)[:1000]
    except Exception:
        message = ""
    error = {
        "type": type(exc).__name__,
        "message": message,
        "where": where,
        "cause": "gpunb itself failed: this is a bug in gpunb, not a finding about this machine.",
        "fix": ISSUES_HINT,
    }
    if as_json and not _emit(json.dumps({"ok": False, "error": error}, indent=2)):
        return EXIT_OUTPUT
    print(f"gpunb check: gpunb itself failed ({error['type']}: {message}) at {where}. {ISSUES_HINT}",
          file=sys.stderr)
    return EXIT_CRASH


if __name__ == "__main__":
    sys.exit(main())
