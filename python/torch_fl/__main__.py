"""``python -m torch_fl``: torch-fl's command line.

``python -m torch_fl compat`` checks a plugin device against PyTorch's CPU
results (:func:`torch_fl.test_compatibility`); ``python -m torch_fl info``
prints the environment report for bug reports (:mod:`torch_fl.info`). Exit codes: 0 every check
passed, 1 a check failed, 3 the plugin could not be loaded or registered.

``python -m torch_fl check PATH...`` reports CUDA-only constructs in Python
code (:mod:`torch_fl.check`). Exit codes: 0 nothing found, 1 something was
found, 2 usage error.

``python -m torch_fl bench`` times ResNet-18, a small GPT and an LSTM (training
and inference) on each device of ``--devices`` (default: the torch-fl device
and ``cpu``; several torch-fl devices run in child processes, one each) and
prints throughputs and ratios (``--json``, ``--html PATH``, ``--quick``,
``--plugin NAME=PATH``; :mod:`torch_fl.bench`). Exit codes: 0 done, 1 a device
could not be measured (its cells say why, the table still prints), 2 usage
error (e.g. an unknown device).

``python -m torch_fl trace -- python train.py`` runs a command under the
device trace and prints, per operator, the plugin's native calls with counts
and device times (:mod:`torch_fl.trace_tool`); it exits with the command's
code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_LOADED = 3


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m torch_fl", description="torch-fl command line")
    commands = parser.add_subparsers(dest="command", required=True)
    compat = commands.add_parser(
        "compat",
        help="check a plugin device against PyTorch's CPU results",
        description="Numerical and autograd conformance of the plugin's operators (PyTorch OpInfo samples), "
        "operator coverage of standard models, and the torchfl-abi ABI checks. "
        "Exit 0: passed, 1: a check failed, 3: the plugin could not be loaded.",
    )
    compat.add_argument("--device", default="sim", help="device name (default: sim, the bundled simulator)")
    compat.add_argument("--plugin", default=None, help="plugin library to register as --device")
    compat.add_argument("--ops", default=None, help="comma-separated op-table names (default: the whole table)")
    compat.add_argument("--dtypes", default="float32", help="comma-separated dtypes (default: float32)")
    compat.add_argument("--no-autograd", action="store_true", help="skip the gradient comparison")
    compat.add_argument("--no-coverage", action="store_true", help="skip the model coverage run")
    compat.add_argument("--no-integrity", action="store_true", help="skip the torchfl-abi verify checks")
    compat.add_argument("--max-samples", type=int, default=8, help="sample inputs per OpInfo and dtype (default: 8)")
    compat.add_argument("--report-dir", default=None, help="write compat.json, compat.html and compat.txt there")
    compat.add_argument("--json", action="store_true", help="print the JSON report on stdout instead of the summary")
    compat.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    info = commands.add_parser(
        "info",
        help="environment report for bug reports",
        description="torch-fl and torch versions, every plugin torch-fl can find (none is initialized), the "
        "registered device, the fallback mode and the torch-fl environment variables.",
    )
    info.add_argument("--json", action="store_true", help="print JSON")
    check = commands.add_parser(
        "check",
        help="find CUDA-only constructs in Python code",
        description="Find CUDA-only constructs in PyTorch code and show (or apply, --fix) the device-agnostic "
        "rewrite; the rules are in docs/check-rules.md. Exit 0: nothing found, 1: something found, 2: usage error.",
    )
    from .check.cli import add_arguments

    add_arguments(check)
    bench = commands.add_parser(
        "bench",
        help="compare devices on the same models",
        description="Time ResNet-18, a small GPT and an LSTM (training and inference) on each device and print "
        "throughputs and ratios; a process holds one torch-fl device, so further ones run in child processes. "
        "Exit 0: done, 1: a device could not be measured (its cells say why; the table still prints), 2: usage "
        "error (e.g. an unknown device).",
    )
    from .bench import add_arguments as add_bench_arguments

    add_bench_arguments(bench)
    trace = commands.add_parser(
        "trace",
        help="run a command under the device trace and print each operator's native calls",
        description="Run COMMAND with the device trace on (TORCH_FL_TRACE, TORCH_FL_TRACE_REPORT) and print, per "
        "operator, the plugin's native runtime calls with counts and host times and its kernels and copies with "
        "device times; writes the Chrome/Perfetto trace of each process beside. Exit: the command's code.",
    )
    from .trace_tool import add_arguments as add_trace_arguments

    add_trace_arguments(trace)
    return parser


def compat_main(args: argparse.Namespace) -> int:
    """Run ``python -m torch_fl compat`` with parsed arguments; return the exit code."""
    import torch

    import torch_fl

    dtypes = []
    for name in _split(args.dtypes) or ["float32"]:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            print(f"error: unknown dtype {name!r} (e.g. float32, float64, bfloat16)", file=sys.stderr)
            return EXIT_USAGE
        dtypes.append(dtype)
    try:
        report = torch_fl.test_compatibility(
            args.device,
            _split(args.ops),
            plugin_path=args.plugin,
            dtypes=dtypes,
            autograd=not args.no_autograd,
            coverage=not args.no_coverage,
            integrity=not args.no_integrity,
            max_samples_per_op=args.max_samples,
            report_dir=args.report_dir,
            progress=not args.no_progress,
        )
    except (torch_fl.PluginLoadError, torch_fl.DeviceRegistrationError) as err:
        print(f"error: the plugin could not be loaded: {err}", file=sys.stderr)
        return EXIT_NOT_LOADED
    if args.json:
        print(report.to_json())
    else:
        print(report.summary())
        if args.report_dir:
            print(f"reports: {args.report_dir}/compat.json, compat.html, compat.txt")
    return EXIT_PASSED if report.passed else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m torch_fl``; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "compat":
        return compat_main(args)
    if args.command == "info":
        from torch_fl import info

        return info.main(args.json)
    if args.command == "check":
        from .check.cli import run

        return run(args)
    if args.command == "bench":
        from .bench import run as run_bench

        return run_bench(args)
    if args.command == "trace":
        from .trace_tool import run as run_trace

        return run_trace(args)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
