"""``python -m torch_fl trace -- COMMAND...``: the debugger as a tool.

Runs ``COMMAND`` (any command: ``python train.py``, ``torchrun ...``) with
the device trace on for its whole run (``TORCH_FL_TRACE`` and
``TORCH_FL_TRACE_REPORT``, so nothing in the script changes), then prints,
per operator, what it made the plugin do: its native runtime calls with
counts and host times, and its kernels and copies with device times, from
the plugin's own activity records (ABI 1.8; a plugin without them gets the
per-operator table of event-timed calls instead). The Chrome/Perfetto trace
of each process is written beside the report::

    $ python -m torch_fl trace --out traces -- python train.py
    add.Tensor (kernel): 120 calls, device 310.2 us
        kernel  add.Tensor         120 x  device      310.2 us
        api     simLaunchKernel    120 x    host       41.0 us
    ...
    torch-fl: traces/trace-12345.json (open it in https://ui.perfetto.dev)

Exit code: the command's own (2 for a usage error).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``trace`` subcommand's arguments."""
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write the traces and reports (default: a new temporary folder)"
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run, after --")


def run(args: argparse.Namespace) -> int:
    """Runs the command under the trace and prints its reports; returns the command's exit code."""
    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("error: nothing to run: python -m torch_fl trace -- python train.py", file=sys.stderr)
        return EXIT_USAGE
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="torch-fl-trace-"))
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("report-*.txt"))
    env = dict(os.environ)
    env["TORCH_FL_TRACE"] = str(out / "trace-{pid}.json")
    env["TORCH_FL_TRACE_REPORT"] = str(out / "report-{pid}.txt")
    try:
        code = subprocess.call(command, env=env)
    except FileNotFoundError as e:
        print(f"error: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        code = 130
    reports = sorted(set(out.glob("report-*.txt")) - before, key=lambda p: p.stat().st_mtime)
    if not reports:
        print(
            "torch-fl: the command traced nothing: it did not register a torch-fl device (import torch_fl, or "
            "install a plugin package that autoloads) or it exited before Python's exit handlers ran",
            file=sys.stderr,
        )
    for report in reports:
        pid = report.stem.removeprefix("report-")
        if len(reports) > 1:
            print(f"== process {pid} ==")
        print(report.read_text(), end="")
        trace = out / f"trace-{pid}.json"
        if trace.exists():
            print(f"torch-fl: {trace} (open it in https://ui.perfetto.dev)")
    return code
