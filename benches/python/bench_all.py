"""Every Python benchmark in one run, summarized as one JSON object (a benchmark, not a test).

Runs bench_dispatch, bench_training (under several configurations),
bench_attention, bench_distributed and bench_graphs, each in a subprocess with a timeout,
and prints a summary; with ``--json`` the LAST line of stdout is one JSON
object with these keys (ratios are measured within one run):

- ``tiny_add_ratio``: a 4-element ``torch.add`` on the device over the CPU;
- ``register_100_ops_ms``: registering a 100-operator plugin, median over
  fresh processes;
- ``layer_share_pct``: torch-fl's layers outside kernels, as a percentage
  of the ResNet-18 training step (default simulator);
- ``pcie_alloc_share_pct``: the percentage of the ResNet-18 step spent
  inside the plugin's allocate/deallocate calls under the simulator's
  ``pcie-gpu`` cost model (``TORCH_FL_SIM_COST_MODEL=pcie-gpu``), caching
  allocator on;
- ``pcie_nocache_over_cache``: the ResNet-18 step time with caching off
  (``TORCH_FL_ALLOC_CONF=backend:plugin``) over caching on, both under
  ``pcie-gpu``;
- ``copy_overlap_ratio``: the ResNet-18 step under ``pcie-gpu`` with
  synchronous input transfers (``x.to(dev)`` from pageable memory) over
  asynchronous ones (pinned batches, the next one copied with
  ``non_blocking=True`` before the current step's compute);
- ``graph_decode_speedup``: batch-1 greedy decoding of the small GPT with a
  static KV cache, tokens/s of the step replayed as a device graph over the
  step run eagerly (bench_graphs.py, default simulator);
- ``graph_decode_speedup_pcie``: the same under ``pcie-gpu``;
- ``graph_decode_native_speedup_pcie``: the same with the simulator's native
  graphs (ABI 1.7: one launch per replay) under ``pcie-gpu``;
- ``graph_train_speedup``: the GPT training step (AdamW), eager step time
  over replayed step time (default simulator).

A benchmark that fails gives ``"failed: <reason>"`` instead of a number,
and one that cannot run here ``"unavailable: <reason>"`` (the ResNet-18
keys when torchvision is not installed, as with a torch release no
torchvision pairs with yet). ``details`` holds each benchmark's own JSON
output.

Run ``make bench-all`` or ``python benches/python/bench_all.py [--json]
[--quick]``; ``--quick`` runs CI-size workloads (minutes become seconds;
the figures are then only smoke values). Figures go in benches/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KEYS = (
    "tiny_add_ratio",
    "register_100_ops_ms",
    "layer_share_pct",
    "pcie_alloc_share_pct",
    "pcie_nocache_over_cache",
    "copy_overlap_ratio",
    "graph_decode_speedup",
    "graph_decode_speedup_pcie",
    "graph_decode_native_speedup_pcie",
    "graph_train_speedup",
)
# The keys measured on ResNet-18, which comes from torchvision.
RESNET_KEYS = ("layer_share_pct", "pcie_alloc_share_pct", "pcie_nocache_over_cache", "copy_overlap_ratio")
NO_TORCHVISION = "unavailable: torchvision is not installed (bench_training.py's ResNet-18 comes from it)"
PCIE = {"TORCH_FL_SIM_COST_MODEL": "pcie-gpu"}
CACHING_OFF = {"TORCH_FL_ALLOC_CONF": "backend:plugin"}


class BenchFailed(Exception):
    """A benchmark subprocess failed, timed out or printed no JSON."""


def _say(message: str) -> None:
    print(f"bench_all: {message}", file=sys.stderr, flush=True)


def last_json(text: str) -> Any:
    """The last JSON document in ``text`` that runs to its end (one line, or indented over several)."""
    decoder = json.JSONDecoder()
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for i in reversed(range(len(lines))):
        if not lines[i].startswith(("{", "[")):
            continue
        try:
            value, end = decoder.raw_decode(text, offsets[i])
        except json.JSONDecodeError:
            continue
        if not text[end:].strip():
            return value
    raise BenchFailed("printed no JSON object")


def run_json(args: list[str], env: dict[str, str] | None, timeout: float) -> Any:
    """Runs ``python <args>`` with ``env`` added and returns its last JSON output."""
    command = [sys.executable, *args]
    start = time.perf_counter()
    try:
        out = subprocess.run(
            command,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise BenchFailed(f"{' '.join(args)} timed out after {timeout:.0f} s") from e
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BenchFailed(f"{' '.join(args)} exited with {out.returncode}: {tail}")
    settings = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    _say(f"{' '.join(args)} {settings}: {time.perf_counter() - start:.0f} s")
    return last_json(out.stdout)


def _attempt(details: dict[str, Any], name: str, args: list[str], env: dict[str, str] | None, timeout: float) -> Any:
    try:
        result = run_json(args, env, timeout)
    except BenchFailed as e:
        details[name] = f"failed: {e}"
        _say(details[name])
        return None
    details[name] = result
    return result


def _resnet_figures(details: dict[str, Any], training: list[str], timeout: float) -> dict[str, Any]:
    """The ResNet-18 keys (``RESNET_KEYS``) from bench_training.py runs."""
    figures: dict[str, Any] = {}
    default = _attempt(details, "training", training, None, timeout)
    figures["layer_share_pct"] = (
        default["layer_share"] * 100 if default else "failed: bench_training.py (see details.training)"
    )

    # The pcie-gpu figures: one profiled run for the allocation share, then
    # unprofiled runs for the step-time ratios (caching on against off,
    # synchronous against asynchronous input transfers).
    device_only = [*training, "--no-cpu"]
    profiled = _attempt(details, "training_pcie", device_only, PCIE, timeout)
    figures["pcie_alloc_share_pct"] = (
        profiled["alloc_share"] * 100 if profiled else "failed: bench_training.py (see details.training_pcie)"
    )
    timed = [*device_only, "--no-profile"]
    cached = _attempt(details, "training_pcie_sync", timed, PCIE, timeout)
    uncached = _attempt(details, "training_pcie_nocache", timed, {**PCIE, **CACHING_OFF}, timeout)
    overlapped = _attempt(details, "training_pcie_async", [*timed, "--input-transfer", "async"], PCIE, timeout)
    figures["pcie_nocache_over_cache"] = (
        uncached["sim_step_ms"] / cached["sim_step_ms"] if uncached and cached else "failed: see details"
    )
    figures["copy_overlap_ratio"] = (
        cached["sim_step_ms"] / overlapped["sim_step_ms"] if cached and overlapped else "failed: see details"
    )
    return figures


def _graph_figures(result: Any) -> dict[str, Any]:
    """The device-graph keys from bench_graphs.py's output (None when it failed)."""

    def pick(model: str, key: str) -> Any:
        try:
            return float(result[model][key])
        except (TypeError, KeyError, ValueError):
            return "failed: bench_graphs.py (see details.graphs)"

    return {
        "graph_decode_speedup": pick("default", "decode_speedup"),
        "graph_decode_speedup_pcie": pick("pcie-gpu", "decode_speedup"),
        "graph_decode_native_speedup_pcie": pick("pcie-gpu", "decode_native_speedup"),
        "graph_train_speedup": pick("default", "train_speedup"),
    }


def collect(quick: bool, timeout: float) -> dict[str, Any]:
    """Runs the benchmarks; returns the summary (``KEYS``, ``details`` and the machine)."""
    details: dict[str, Any] = {}
    bench = [str(HERE / "bench_dispatch.py"), "--json"]
    training = [str(HERE / "bench_training.py"), "--json"]
    attention = [str(HERE / "bench_attention.py"), "--json", "--threads", "1"]
    distributed = [str(HERE / "bench_distributed.py"), "--json"]
    graphs = [str(HERE / "bench_graphs.py"), "--json"]
    if quick:
        bench += ["--calls", "2000", "--repeats", "3", "--register-runs", "3"]
        training += ["--batch-size", "2", "--image-size", "32", "--steps", "2", "--warmup", "1"]
        attention += ["--rounds", "1", "--steps", "1", "--warmup", "1", "--runs", "1", "--new-tokens", "2"]
        attention += ["--seq", "32", "--batch", "2"]
        distributed += ["--quick"]
        graphs += ["--tokens", "40", "--steps", "2", "--runs", "1"]
    summary: dict[str, Any] = {}

    dispatch = _attempt(details, "dispatch", bench, None, timeout)
    summary["tiny_add_ratio"] = (
        dispatch["add"]["ratio"] if dispatch else "failed: bench_dispatch.py (see details.dispatch)"
    )
    summary["register_100_ops_ms"] = (
        dispatch["register"]["median_ms"] if dispatch else "failed: bench_dispatch.py (see details.dispatch)"
    )

    if importlib.util.find_spec("torchvision") is None:
        # Five subprocesses that would each fail on the import.
        details["training"] = NO_TORCHVISION
        _say(NO_TORCHVISION)
        summary.update(dict.fromkeys(RESNET_KEYS, NO_TORCHVISION))
    else:
        summary.update(_resnet_figures(details, training, timeout))

    _attempt(details, "attention", attention, None, timeout)
    _attempt(details, "distributed", distributed, None, timeout)
    summary.update(_graph_figures(_attempt(details, "graphs", graphs, None, timeout)))
    for key in KEYS:
        if isinstance(summary[key], float):
            summary[key] = round(summary[key], 6)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        **{key: summary[key] for key in KEYS},
        "quick": quick,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_1min_at_end": None if load is None else round(load[0], 2),
        },
        "details": details,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object on the last line")
    parser.add_argument("--quick", action="store_true", help="CI-size workloads (smoke figures, not measurements)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per benchmark process (default 900)")
    args = parser.parse_args()
    timeout = args.timeout if args.timeout is not None else 900.0
    result = collect(args.quick, timeout)
    if args.json:
        print(json.dumps(result, separators=(",", ":")))
        return
    for key in KEYS:
        value = result[key]
        print(f"{key:>26}: {value:.4g}" if isinstance(value, float) else f"{key:>26}: {value}")


if __name__ == "__main__":
    main()
