"""``gpunb check`` in a terminal: the same checklist for people not in a notebook yet."""

from __future__ import annotations

import argparse
import sys

from gpunb._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpunb", description="GPU training setup checks (the terminal side of gpunb).")
    parser.add_argument("--version", action="version", version=f"gpunb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = sub.add_parser("check", help="run the setup checklist; exit code 1 if a check fails",
                           description="Run the GPU training setup checklist. Exit status: 0 when no check "
                                       "fails (warnings allowed), 1 when one fails, 2 on bad arguments.")
    check.add_argument("--quick", action="store_true", help="skip the CUDA smoke test, matmul and copy measurements")
    check.add_argument("--deep", action="store_true",
                       help="also an NCCL all-reduce across every GPU (subprocesses, killed after 90 s)")
    check.add_argument("--device", type=int, metavar="N", help="check only cuda:N")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "check":
        parser.print_help()
        return 2
    from gpunb.analysis.checks import CheckOptionError, check

    def progress(partial) -> None:
        if partial.in_progress and sys.stderr.isatty():
            print(f"gpunb check: {partial.in_progress}", file=sys.stderr, flush=True)

    try:
        report = check(quick=args.quick, device=args.device, deep=args.deep, progress=progress, in_kernel=False)
    except CheckOptionError as exc:
        print(f"gpunb check: error: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else str(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
