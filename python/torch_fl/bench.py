"""``python -m torch_fl bench``: the same models, timed on several devices in one run.

Three workloads — ResNet-18 (torchvision, skipped with the reason when it is
not importable), a small GPT (:class:`torch_fl.lm.GPT`) and an LSTM
classifier — each in training mode (forward, loss, backward, SGD step) and in
inference mode (a forward under :func:`torch.no_grad`). Every device gets the
same weights and the same batch (one seed, built on the CPU and copied), so
the figures compare the devices and nothing else. Inputs are copied to the
device before the clock starts: the figures are compute, not host-to-device
copies. Each step ends with a device synchronize before the clock is read,
because a plugin's kernels may still be queued when the Python call returns.

Throughput is samples/s (tokens/s for the GPT) of the median timed step; the ratio of a device is its
throughput divided by the baseline's (``cpu`` when it is among the devices,
else the first one). CPU fallbacks seen on a plugin device
(:func:`torch_fl.fallback_stats`) are reported per workload and mode: a
workload that falls back measures the host as much as the device.

Several torch-fl devices in one run (``--devices ocl,sim,cpu``): PyTorch has
one custom-device slot per process, so ``cpu`` and at most one torch-fl
device (the one this process already has, else the only one asked for) are
measured here, and every other torch-fl device in a child process running
this bench with ``--devices <device> --json`` and the same options, one
after the other, each bounded by ``--timeout`` (:mod:`torch_fl.bench_children`).
Their reports merge into one table: rows by workload and mode, devices in the
order asked, ratios against the baseline. ``sim`` is the bundled simulator,
``--plugin NAME=PATH`` registers NAME from a library, and any other name is
found by :func:`torch_fl.register_device_plugin`'s discovery
(``TORCH_FL_PLUGIN_PATH``, installed plugin packages).

Exit codes: 0 every device measured (a workload that raised is an ``error``
cell and a note, as a skipped one is); 1 a device could not be measured at
all (its plugin did not register, its child process failed, printed no
report or timed out): its cells are errors with the cause, the child's
stderr tail is listed under the table, and the table still prints; 2 a usage
error, such as a device no plugin is found for, reported before anything is
timed.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .bench_children import (
    DEFAULT_TIMEOUT_S,
    ChildResult,
    check_device,
    measure_in_child,
    parse_plugins,
    plan_devices,
)

__all__ = ["add_arguments", "machine_info", "render_html", "render_text", "resolve_devices", "run", "run_bench"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
_SEED = 0
MODES = ("train", "infer")


@dataclass
class _Case:
    """A built workload: the model, one batch and how to score it; all on the CPU."""

    model: nn.Module
    inputs: torch.Tensor
    targets: torch.Tensor
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    items: int  # samples (or tokens) per step


def _resnet18(quick: bool) -> _Case:
    import torchvision

    batch, side = (2, 32) if quick else (16, 64)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    inputs = torch.randn(batch, 3, side, side)
    targets = torch.randint(0, 10, (batch,))
    return _Case(model, inputs, targets, nn.functional.cross_entropy, batch)


def _gpt(quick: bool) -> _Case:
    from .lm import GPT

    batch, context, width, layers = (2, 16, 32, 2) if quick else (8, 64, 128, 4)
    vocab = 256
    model = GPT(vocab=vocab, width=width, heads=4, layers=layers, context=context)
    tokens = torch.randint(0, vocab, (batch, context + 1))

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return _Case(model, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), loss, batch * context)


class _LSTMClassifier(nn.Module):
    """An LSTM over a feature sequence, classified from its last hidden state."""

    def __init__(self, features: int, hidden: int, layers: int, classes: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        logits: torch.Tensor = self.head(out[:, -1])
        return logits


def _lstm(quick: bool) -> _Case:
    batch, length, features, hidden = (4, 8, 16, 32) if quick else (32, 32, 64, 128)
    model = _LSTMClassifier(features, hidden, layers=2, classes=10)
    inputs = torch.randn(batch, length, features)
    targets = torch.randint(0, 10, (batch,))
    return _Case(model, inputs, targets, nn.functional.cross_entropy, batch)


#: name, unit of throughput, builder.
WORKLOADS: list[tuple[str, str, Callable[[bool], _Case]]] = [
    ("resnet18", "samples/s", _resnet18),
    ("gpt", "tokens/s", _gpt),
    ("lstm", "samples/s", _lstm),
]


def _unavailable(name: str) -> str | None:
    """Why workload ``name`` cannot run in this environment, or None."""
    if name == "resnet18":
        try:
            import torchvision  # noqa: F401
        except Exception as err:
            return f"torchvision is not importable ({type(err).__name__}: {err})"
    return None


def _registered_device() -> str | None:
    """The torch-fl device of this process (registered or pending autoload), or None."""
    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone":
        return name
    from ._lazy_device import pending_device

    return pending_device()


def resolve_devices(requested: Sequence[str] | None, plugins: Mapping[str, str] | None = None) -> list[str]:
    """The devices to measure, in the order asked and without repeats; nothing is registered or initialized.

    Default: the torch-fl device of this process (else ``sim``) and ``cpu``.
    ``plugins`` are the ``--plugin NAME=PATH`` libraries.

    Raises:
        ValueError: a name that is a PyTorch device type other than ``cpu``,
            or one for which no plugin is found (the message says what to do).
    """
    registered = _registered_device()
    names = list(dict.fromkeys(requested)) if requested else [registered or "sim", "cpu"]
    for name in names:
        check_device(name, plugins or {}, registered)
    return names


def _register_here(name: str, plugins: Mapping[str, str]) -> None:
    """Make ``name`` the torch-fl device of this process unless it already is (or is pending autoload)."""
    if _registered_device() == name:
        return
    from .registration import register_device_plugin

    register_device_plugin(name=name, plugin_path=plugins.get(name))


def _plugin_label() -> str | None:
    """``"<plugin name> <version>"`` of this process' torch-fl device, or None."""
    from . import _native

    runtime = _native.bound_runtime()
    return None if runtime is None else f"{runtime.name} {runtime.plugin_version}"


def _synchronize(device: str) -> None:
    if device != "cpu":
        torch.get_device_module(device).synchronize()


def _time_case(case: _Case, device: str, mode: str, warmup: int, steps: int) -> list[float]:
    """Seconds of each timed step of ``case`` on ``device``."""
    model = case.model.to(device)
    inputs, targets = case.inputs.to(device), case.targets.to(device)
    if mode == "train":
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            opt.zero_grad()
            case.loss(model(inputs), targets).backward()
            opt.step()

    else:
        model.eval()

        def step() -> None:
            with torch.no_grad():
                model(inputs)

    for _ in range(warmup):
        step()
    _synchronize(device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def _measure(build: Callable[[bool], _Case], device: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One workload, mode and device: throughput and step times, or why it could not run."""
    from .fallback import fallback_stats, reset_fallback_stats

    torch.manual_seed(_SEED)
    case = build(args.quick)
    if device != "cpu":
        reset_fallback_stats()
    try:
        times = _time_case(case, device, mode, args.warmup, args.steps)
    except Exception as err:
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
    median = statistics.median(times)
    result: dict[str, Any] = {
        # From the median step, not the total: one step stalled by another
        # process on a shared host would otherwise move the figure.
        "throughput": case.items / median if median > 0 else math.inf,
        "median_step_ms": median * 1e3,
        "steps": len(times),
        "items_per_step": case.items,
    }
    if device != "cpu":
        result["fallbacks"] = fallback_stats()
    return result


def machine_info() -> dict[str, Any]:
    """The host the figures come from."""
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def _measure_rows(devices: Sequence[str], args: argparse.Namespace, progress: bool) -> list[dict[str, Any]]:
    """Every workload and mode timed on ``devices`` in this process: rows without ratios."""
    rows = []
    for name, unit, build in WORKLOADS:
        skip = _unavailable(name)
        for mode in MODES:
            row: dict[str, Any] = {"workload": name, "mode": mode, "unit": unit, "devices": {}}
            for device in devices:
                if skip is not None:
                    row["devices"][device] = {"skipped": skip}
                    continue
                if progress:
                    print(f"bench: {name} {mode} on {device}", file=sys.stderr, flush=True)
                row["devices"][device] = _measure(build, device, mode, args)
            rows.append(row)
    return rows


def _child_cell(child: ChildResult, key: tuple[str, str]) -> dict[str, Any]:
    """A device's cell for ``key`` (workload, mode) from its child process' report, or the child's error."""
    for row in (child.report or {}).get("results", []):
        if (row.get("workload"), row.get("mode")) == key:
            cell: dict[str, Any] = row["devices"][child.device]
            return cell
    cell = {"error": child.error or f"the child process measuring {child.device!r} reported no {' '.join(key)} row"}
    if child.returncode != 0:
        cell["stderr"] = child.stderr_tail
    return cell


def _device_info(
    devices: Sequence[str], info: Mapping[str, dict[str, Any]], children: Mapping[str, ChildResult]
) -> dict[str, dict[str, Any]]:
    """Per device: where it was measured, its plugin, and why it could not be when it could not."""
    out: dict[str, dict[str, Any]] = {}
    for device in devices:
        child = children.get(device)
        if child is None:
            out[device] = {"process": "this", **info.get(device, {})}
            continue
        reported = (child.report or {}).get("device_info", {}).get(device, {})
        entry = {**reported, "process": "child", "seconds": round(child.seconds, 1)}
        if child.error is not None:
            entry.setdefault("error", child.error)
        if child.returncode != 0:
            entry["stderr"] = child.stderr_tail
        out[device] = entry
    return out


def _assemble(
    devices: Sequence[str],
    rows: Sequence[dict[str, Any]],
    args: argparse.Namespace,
    info: Mapping[str, dict[str, Any]],
    children: Mapping[str, ChildResult],
) -> dict[str, Any]:
    """One report: this process' ``rows`` and the ``children``'s, in the order of ``devices``, with ratios."""
    import torch_fl

    baseline = "cpu" if "cpu" in devices else devices[0]
    here = {(r["workload"], r["mode"]): r["devices"] for r in rows}
    results = []
    for name, unit, _build in WORKLOADS:
        for mode in MODES:
            cells: dict[str, Any] = {}
            for device in devices:
                if device in children:
                    cells[device] = _child_cell(children[device], (name, mode))
                elif "error" in info.get(device, {}):
                    cells[device] = {"error": info[device]["error"]}
                else:
                    cells[device] = here[(name, mode)][device]
            base = cells[baseline].get("throughput")
            ratios = {d: c["throughput"] / base if "throughput" in c and base else None for d, c in cells.items()}
            results.append({"workload": name, "mode": mode, "unit": unit, "devices": cells, "ratios": ratios})
    return {
        "machine": machine_info(),
        "torch": torch.__version__,
        "torch_fl": torch_fl.__version__,
        "devices": list(devices),
        "device_info": _device_info(devices, info, children),
        "baseline": baseline,
        "quick": args.quick,
        "warmup": args.warmup,
        "steps": args.steps,
        "results": results,
    }


def run_bench(devices: Sequence[str], args: argparse.Namespace, progress: bool = True) -> dict[str, Any]:
    """Time every workload and mode on ``devices``, all in this process; the report as a JSON-ready dict.

    The torch-fl device among ``devices`` must be registered already (or
    pending autoload); :func:`run` measures others in child processes.
    """
    rows = _measure_rows(devices, args, progress)
    info = {d: {"plugin": _plugin_label()} for d in devices if d != "cpu"}
    return _assemble(devices, rows, args, info, {})


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def _cell(entry: dict[str, Any]) -> str:
    if "throughput" in entry:
        return _fmt(entry["throughput"])
    return "skipped" if "skipped" in entry else "error"


def _table(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    devices, baseline = report["devices"], report["baseline"]
    header = ["workload", "mode", "unit", *devices, *(f"{d}/{baseline}" for d in devices if d != baseline)]
    rows = []
    for r in report["results"]:
        cells = [r["workload"], r["mode"], r["unit"], *(_cell(r["devices"][d]) for d in devices)]
        cells += [_fmt(r["ratios"][d]) for d in devices if d != baseline]
        rows.append(cells)
    return header, rows


def _device_notes(report: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """A note per device that could not be measured (with its child's stderr tail), and each one's error."""
    notes: list[str] = []
    errors: dict[str, str] = {}
    for device, info in report.get("device_info", {}).items():
        if "error" not in info:
            continue
        errors[device] = info["error"]
        notes.append(f"{device} could not be measured: {info['error']}")
        tail = [line for line in info.get("stderr", "").splitlines() if line.strip()]
        if tail:
            notes.append("  the end of its child process' stderr:")
            notes += [f"  | {line}" for line in tail]
    return notes, errors


def _notes(report: dict[str, Any]) -> list[str]:
    """Devices that could not be measured, then skips, errors and CPU fallbacks, one line each."""
    notes, device_errors = _device_notes(report)
    seen_skips: set[str] = set()
    for r in report["results"]:
        for device, entry in r["devices"].items():
            where = f"{r['workload']} {r['mode']} on {device}"
            if "skipped" in entry and r["workload"] not in seen_skips:
                seen_skips.add(r["workload"])
                notes.append(f"{r['workload']} skipped: {entry['skipped']}")
            elif "error" in entry and entry["error"] != device_errors.get(device):
                notes.append(f"{where} failed: {entry['error']}")
            elif entry.get("fallbacks"):
                ops = ", ".join(f"{op} x{n}" for op, n in entry["fallbacks"].items())
                notes.append(f"{where}: CPU fallbacks {ops}")
    return notes


def _devices_line(report: dict[str, Any]) -> str:
    """``devices: ocl (opencl 0.1.0, child process, 31.2 s), cpu``: where each was measured, and its plugin."""
    parts = []
    for device in report["devices"]:
        info = report.get("device_info", {}).get(device, {})
        details = [info["plugin"]] if info.get("plugin") else []
        if info.get("process") == "child":
            details.append(f"child process, {info['seconds']:g} s" if "seconds" in info else "child process")
        parts.append(f"{device} ({', '.join(details)})" if details else device)
    return "devices: " + ", ".join(parts)


def render_text(report: dict[str, Any]) -> str:
    """The report as a plain-text table followed by skips, errors and CPU fallbacks."""
    header, rows = _table(report)
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    m = report["machine"]
    out = [
        f"torch {report['torch']}, torch-fl {report['torch_fl']}, {m['platform']}, {m['cpu_count']} CPUs, "
        f"torch threads: {m['torch_threads']}; {report['warmup']} warm-up + {report['steps']} timed steps"
        + (" (--quick)" if report["quick"] else ""),
        line(header),
        line(["-" * w for w in widths]),
        *(line(r) for r in rows),
        "",
        _devices_line(report),
    ]
    notes = _notes(report)
    if notes:
        out += ["", *notes]
    else:
        out += ["", "no CPU fallbacks"]
    return "\n".join(out)


_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948"]


def _svg(report: dict[str, Any]) -> str:
    """A grouped bar chart of each device's throughput relative to the baseline, as inline SVG.

    The axis is logarithmic around 1.0 (the baseline): devices differ by orders
    of magnitude, and a linear axis would flatten every bar but the tallest.
    Bars grow up from 1.0 when faster than the baseline, down when slower.
    """
    devices, results, baseline = report["devices"], report["results"], html.escape(report["baseline"])
    ratios = [v for r in results for v in r["ratios"].values() if v]
    lo = math.floor(math.log10(min([1.0, *ratios])) - 0.01)
    hi = math.ceil(math.log10(max([1.0, *ratios])) + 0.01)
    bar, gap, left, height, top, plot_h = 18, 40, 50, 330, 30, 230
    group_w = bar * len(devices) + gap
    width = left + group_w * len(results) + 20

    def y(v: float) -> float:
        return top + plot_h * (hi - math.log10(v)) / (hi - lo)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="throughput relative to {baseline}">',
        f'<text x="{left}" y="16" font-size="12">throughput relative to {baseline} (log scale)</text>',
    ]
    for e in range(lo, hi + 1):
        parts.append(
            f'<line x1="{left}" y1="{y(10.0**e):.1f}" x2="{width - 10}" y2="{y(10.0**e):.1f}" '
            f'stroke="{"#333" if e == 0 else "#ddd"}"/>'
        )
        parts.append(
            f'<text x="{left - 4}" y="{y(10.0**e) + 4:.1f}" font-size="10" text-anchor="end">{10.0**e:g}</text>'
        )
    for g, r in enumerate(results):
        x0 = left + gap / 2 + g * group_w
        for i, d in enumerate(devices):
            v = r["ratios"].get(d)
            if not v:
                continue
            y0, y1 = sorted((y(1.0), y(v)))
            parts.append(
                f'<rect x="{x0 + i * bar:.1f}" y="{y0:.1f}" width="{bar - 2}" height="{max(y1 - y0, 1.0):.1f}" '
                f'fill="{_COLORS[i % len(_COLORS)]}"><title>{html.escape(d)}: {v:.3g}</title></rect>'
            )
        cx = x0 + bar * len(devices) / 2
        for k, word in enumerate((r["workload"], r["mode"])):
            parts.append(
                f'<text x="{cx:.1f}" y="{top + plot_h + 14 + 12 * k}" font-size="10" '
                f'text-anchor="middle">{html.escape(word)}</text>'
            )
    for i, d in enumerate(devices):
        lx = left + i * 90
        parts.append(f'<rect x="{lx}" y="{height - 22}" width="10" height="10" fill="{_COLORS[i % len(_COLORS)]}"/>')
        parts.append(f'<text x="{lx + 14}" y="{height - 13}" font-size="11">{html.escape(d)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(report: dict[str, Any]) -> str:
    """A self-contained HTML page: machine, table, bar chart (inline SVG) and notes."""
    header, rows = _table(report)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in _notes(report)) or "<li>no CPU fallbacks</li>"
    machine = html.escape(json.dumps(report["machine"]))
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>torch-fl bench</title>
<style>body{{font-family:sans-serif}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}</style></head>
<body><h1>torch-fl bench</h1>
<p>torch {html.escape(report["torch"])}, torch-fl {html.escape(report["torch_fl"])};
{report["warmup"]} warm-up + {report["steps"]} timed steps{" (--quick)" if report["quick"] else ""}</p>
<p>machine: {machine}</p>
<p>{html.escape(_devices_line(report))}</p>
<table><thead><tr>{head}</tr></thead><tbody>
{body}
</tbody></table>
{_svg(report)}
<ul>{notes}</ul>
</body></html>
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m torch_fl bench``."""
    parser.add_argument(
        "--devices",
        default=None,
        help="comma-separated devices, in the table's order: cpu and any torch-fl devices (sim: the bundled "
        "simulator; another name: a --plugin, else found like register_device_plugin(name=...) finds it, by "
        "TORCH_FL_PLUGIN_PATH and installed plugin packages). With several torch-fl devices, each but this "
        "process' own (if it has one) runs in a child process; default: the torch-fl device (else sim) and cpu",
    )
    parser.add_argument(
        "--plugin",
        action="append",
        default=None,
        metavar="NAME=PATH",
        help="register the device NAME from the plugin library PATH (repeatable), e.g. "
        "ocl=target/release/libtorchfl_opencl.so",
    )
    parser.add_argument("--quick", action="store_true", help="tiny models and few steps (under a minute)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: 20, --quick: 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed warm-up steps (default: 3, --quick: 1)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads for the whole run (default: torch's); 1 steadies the CPU figures on a busy host",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"seconds a device measured in a child process may take before it is killed and reported as an "
        f"error (default: {DEFAULT_TIMEOUT_S[0]:g}, --quick: {DEFAULT_TIMEOUT_S[1]:g})",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    parser.add_argument("--html", default=None, metavar="PATH", help="also write an HTML report with a plot")


def _check_options(args: argparse.Namespace) -> str | None:
    """Fill in the defaults that depend on ``--quick``; a usage error, or None."""
    args.steps = args.steps if args.steps is not None else (3 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.timeout = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT_S[1 if args.quick else 0]
    if args.steps < 1 or args.warmup < 0 or (args.threads is not None and args.threads < 1):
        return "--steps and --threads must be at least 1 and --warmup at least 0"
    if not args.timeout > 0:
        return "--timeout must be more than 0 seconds"
    return None


def _measure_all(devices: Sequence[str], args: argparse.Namespace, plugins: Mapping[str, str]) -> dict[str, Any] | int:
    """Register this process' torch-fl device, run the children, time the rest: the report, or a usage exit code."""
    from .errors import PluginNotFoundError

    local, remote = plan_devices(devices, _registered_device())
    info: dict[str, dict[str, Any]] = {}
    if local is not None:
        try:
            _register_here(local, plugins)
        except PluginNotFoundError as err:
            print(f"error: unknown device {local!r}: {err}", file=sys.stderr)
            return EXIT_USAGE
        except Exception as err:  # torch-fl's errors, and torch's own (a device string it refuses)
            info[local] = {"error": f"cannot register the device {local!r}: {type(err).__name__}: {err}"}
            print(f"error: {info[local]['error']}", file=sys.stderr)
    children: dict[str, ChildResult] = {}
    for device in remote:
        children[device] = child = measure_in_child(device, args, plugins)
        if child.returncode == EXIT_USAGE:
            print(child.stderr_tail, file=sys.stderr)
            return EXIT_USAGE
    here = [d for d in devices if d not in children and "error" not in info.get(d, {})]
    rows = _measure_rows(here, args, progress=True)
    if local in here:
        info[local] = {"plugin": _plugin_label()}
    return _assemble(devices, rows, args, info, children)


def run(args: argparse.Namespace) -> int:
    """Run ``python -m torch_fl bench`` with parsed arguments; return the exit code (see the module docstring)."""
    problem = _check_options(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    requested = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else None
    try:
        plugins = parse_plugins(args.plugin)
        devices = resolve_devices(requested, plugins)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    report = _measure_all(devices, args, plugins)
    if isinstance(report, int):
        return report
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(render_html(report))
    print(json.dumps(report, indent=2) if args.json else render_text(report))
    failed = any("error" in info for info in report["device_info"].values())
    return EXIT_FAILED if failed else EXIT_OK
