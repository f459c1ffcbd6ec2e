"""``gpunb check`` in a terminal: the same checklist for people not in a notebook yet.

Exit status: 0 no check failed (warnings allowed), 1 a check failed, 2 bad arguments,
3 gpunb itself failed (a bug; under ``--json`` a JSON object with an ``error`` key).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from gpunb._version import __version__

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_CRASH = 0, 1, 2, 3
ISSUES_HINT = "Please report it to the gpunb maintainers with this message and `gpunb --version`."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpunb",
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # bad arguments: argparse prints the usage and exits with 2
    if args.command != "check":
        parser.print_help()
        return EXIT_USAGE
    try:
        return _check(args)
    except Exception as exc:  # a bug of gpunb: say so in the output's own format, never a traceback
        return _crashed(exc, as_json=args.json)


def _check(args: argparse.Namespace) -> int:
    from gpunb.analysis.checks.checklist import CheckOptionError, check

    def progress(partial) -> None:
        if partial.in_progress and sys.stderr.isatty():
            print(f"gpunb check: {partial.in_progress}", file=sys.stderr, flush=True)

    try:
        report = check(quick=args.quick, device=args.device, deep=args.deep, progress=progress, in_kernel=False)
    except CheckOptionError as exc:
        print(f"gpunb check: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(report.to_json() if args.json else str(report))
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
    if as_json:
        print(json.dumps({"ok": False, "error": error}, indent=2))
    print(f"gpunb check: gpunb itself failed ({error['type']}: {message}) at {where}. {ISSUES_HINT}",
          file=sys.stderr)
    return EXIT_CRASH


if __name__ == "__main__":
    sys.exit(main())
