"""Command line: ``python -m fastattn {bench,trace,info} ...``.

The first argument picks the subcommand; everything after it is handed,
untouched, to that subcommand (so ``python -m fastattn bench --help`` shows
the benchmark's own options).
"""

from __future__ import annotations

import argparse
import sys

COMMANDS = {
    "bench": "time fastattn against torch SDPA and the NumPy/SciPy composition",
    "trace": "run the fastattn tracing tool (fastattn.trace)",
    "info": "show how fastattn was built and which ISA it uses",
}


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fastattn",
        description="fastattn command line tools.",
        epilog="Run 'python -m fastattn COMMAND --help' for a command's options.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def _bench(argv: list[str]) -> int:
    from fastattn.bench import main
    return main(argv)


def _trace(argv: list[str]) -> int:
    from fastattn._trace_cli import main
    return main(argv)


def _info(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m fastattn info",
                                description=COMMANDS["info"] + ".")
    p.parse_args(argv)
    import fastattn
    fastattn.show_config()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        handler = {"bench": _bench, "trace": _trace, "info": _info}[argv[0]]
        rc = handler(argv[1:])
        return 0 if rc is None else int(rc)
    parser = _top_parser()
    args = parser.parse_args(argv)      # --help exits 0; unknown commands exit 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return 2  # pragma: no cover - every command is dispatched above


if __name__ == "__main__":
    sys.exit(main())
