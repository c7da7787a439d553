"""Command line of the checker: ``python -m torch_fl check`` and ``torchfl-check``."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from . import report
from .rules import RULES

if TYPE_CHECKING:
    from .engine import Finding

EXIT_CLEAN = 0
EXIT_FOUND = 1
EXIT_USAGE = 2

#: Directories never searched when a directory is given.
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", "node_modules", "site-packages"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The checker's options, shared by ``python -m torch_fl check`` and ``torchfl-check``."""
    parser.add_argument("paths", nargs="*", metavar="PATH", help="Python files or directories (searched for *.py)")
    parser.add_argument("--format", choices=("text", "json", "sarif"), default="text", help="output format")
    parser.add_argument("--fix", action="store_true", help="apply the mechanical rewrites in place")
    parser.add_argument("--diff", action="store_true", help="print the --fix rewrites as a unified diff; write nothing")
    parser.add_argument("--select", default=None, help="comma-separated rule ids to report (default: all)")
    parser.add_argument("--list-rules", action="store_true", help="print the rule table and exit")


def parser() -> argparse.ArgumentParser:
    """The ``torchfl-check`` argument parser."""
    p = argparse.ArgumentParser(
        prog="torchfl-check",
        description="Find CUDA-only constructs in PyTorch code and show (or apply, --fix) the device-agnostic "
        "rewrite. Exit 0: nothing found, 1: something found, 2: usage error.",
    )
    add_arguments(p)
    return p


def iter_files(paths: Sequence[str]) -> Iterator[Path]:
    """The files to check: each file given, and every ``*.py`` under each directory, sorted."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for found in sorted(path.rglob("*.py")):
                if not SKIP_DIRS.intersection(found.relative_to(path).parts[:-1]):
                    yield found
        else:
            yield path


def _parse_error(path: Path, err: Exception) -> Finding:
    from .engine import Finding

    line = int(getattr(err, "raw_line", 1) or 1)
    column = int(getattr(err, "raw_column", 0) or 0) + 1
    message = str(err).splitlines()[0] if str(err) else type(err).__name__
    return Finding(str(path), line, column, line, column, "FL000", f"cannot check this file: {message}", "", False)


def run(args: argparse.Namespace) -> int:
    """Run the checker with parsed arguments; return the exit code."""
    if args.list_rules:
        for rule in RULES:
            print(f"{rule.id}  {rule.name:<28} {'fixable' if rule.fixable else '       '}  {rule.what}")
        return EXIT_CLEAN
    if not args.paths:
        print("error: give at least one file or directory to check", file=sys.stderr)
        return EXIT_USAGE
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        print(f"error: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    selected = {s.strip().upper() for s in args.select.split(",")} if args.select else None
    try:
        from . import engine  # its ImportError says how to install libcst
    except ImportError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE

    findings: list[Finding] = []
    diffs: list[str] = []
    fixed_count = 0
    files = list(iter_files(args.paths))
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            if args.fix or args.diff:
                new_source, fixed = engine.fix_source(source, str(path))
                if new_source != source:
                    fixed_count += len(fixed)
                    if args.diff:
                        diffs.append(_diff(str(path), source, new_source))
                    else:
                        path.write_text(new_source, encoding="utf-8")
                        source = new_source
            found = engine.check_source(source, str(path))
        except (engine.ParserSyntaxError, UnicodeDecodeError, OSError) as err:
            found = [_parse_error(path, err)]
        findings.extend(f for f in found if selected is None or f.rule in selected or f.rule == "FL000")

    if args.diff:
        sys.stdout.write("".join(diffs))
    elif args.format == "json":
        print(report.as_json(findings))
    elif args.format == "sarif":
        print(report.sarif(findings))
    else:
        if findings:
            print(report.text(findings))
        if args.fix:
            print(f"fixed {fixed_count} construct(s)")
        print(report.summary(findings, len(files)))
    return EXIT_FOUND if findings else EXIT_CLEAN


def _diff(path: str, before: str, after: str) -> str:
    # git-style a/ b/ prefixes for relative paths; an absolute path is shown as it is.
    old, new = (path, path) if Path(path).is_absolute() else (f"a/{path}", f"b/{path}")
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), old, new)
    return "".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``torchfl-check``; returns the exit code."""
    return run(parser().parse_args(argv))
