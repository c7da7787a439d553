"""Python benchmarks of torch-fl's dispatch path (not tests: they measure).

- ``add``: per-call latency of a 4-element ``torch.add`` on the plugin
  device against the same call on CPU tensors, in one process, as a ratio
  (target: at most 1.5);
- ``register``: time to register a plugin with about 100 operators (load,
  handshake, validation, kernel registration with PyTorch), measured in a
  fresh process per run (target: under 1 ms).

Run ``make bench-python`` or ``python benches/python/bench_dispatch.py``;
``--json`` prints machine-readable results. Figures go in benches/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torchfl_abi  # noqa: E402 - installed with torch-fl
from tests.plugins.build import compile_plugin  # noqa: E402 - the repository root is on the path only from here


def per_call_us(fn, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of ``calls`` calls, in µs."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def bench_add(calls: int, repeats: int) -> dict[str, float]:
    import torch

    import torch_fl

    torch_fl.register_device_plugin(name="sim")
    a_cpu, b_cpu = torch.ones(4), torch.ones(4)
    a_dev, b_dev = a_cpu.to("sim"), b_cpu.to("sim")

    def dev_add() -> None:
        torch.add(a_dev, b_dev)

    def cpu_add() -> None:
        torch.add(a_cpu, b_cpu)

    for fn in (cpu_add, dev_add):  # warm up caches and allocators
        per_call_us(fn, calls, 1)
    cpu = per_call_us(cpu_add, calls, repeats)
    # Device work is asynchronous: include the time to drain the queue.
    start = time.perf_counter()
    dev = per_call_us(dev_add, calls, repeats)
    torch.sim.synchronize()
    drained = (time.perf_counter() - start) / (calls * repeats) * 1e6
    return {"cpu_us": cpu, "device_us": dev, "device_drained_us": drained, "ratio": max(dev, drained) / cpu}


# 100 real ATen operators (functional, not CompositeImplicitAutograd) for
# the registration benchmark's plugin; their kernels are never called.
REGISTER_OPS = [
    f"{op}"
    for op in (
        "abs acos acosh asin asinh atan atanh ceil cos cosh erf erfc erfinv exp exp2 expm1 floor frac lgamma log "
        "log10 log1p log2 neg reciprocal round rsqrt sigmoid sign sin sinc sinh sqrt tan tanh trunc digamma "
        "abs_ acos_ asin_ atan_ ceil_ cos_ cosh_ erf_ erfc_ exp_ expm1_ floor_ frac_ log_ log10_ log1p_ log2_ "
        "reciprocal_ round_ rsqrt_ sigmoid_ sign_ sin_ sinh_ sqrt_ tan_ tanh_ trunc_ relu relu_ gelu silu "
        "hardtanh elu leaky_relu logit nan_to_num angle conj_physical bitwise_not logical_not signbit isnan "
        "sgn deg2rad rad2deg fix fix_ i0 i0_ mish hardswish hardsigmoid softplus threshold clamp_min clamp_max "
        "tril triu flip cumsum hardshrink softshrink selu celu"
    ).split()
    # The plugin builds on the C example (tests/plugins/base.h), which defines these two.
    if op not in ("neg", "relu")
][:100]


def plugin_source(ops: list[str]) -> str:
    lines = ['#include "base.h"']
    entries = []
    # The mangling rule from torch-fl's native module, loaded without torch
    # (this driver process times others and imports no torch itself).
    kernel_symbol = torchfl_abi._native().kernel_symbol
    neg = kernel_symbol("neg")  # the example's kernel every benchmark operator reuses
    for op in ops:
        symbol = kernel_symbol(op)
        lines.append(f"TFL_EXPORT TFL_Error* {symbol}(const TFL_CallFrame* f) {{ return {neg}(f); }}")
        entries.append(f'  TFLH_OP("{op}", {symbol}),')
    lines.append("static const TFL_OpEntry g_bench_ops[] = {")
    lines += entries
    lines.append("};")
    lines.append(
        textwrap.dedent(
            """
            static TFL_Error* bench_get_op_table(TFL_OpTable* out) {
              out->entries = g_bench_ops; out->num_entries = sizeof g_bench_ops / sizeof g_bench_ops[0];
              out->entry_size = sizeof(TFL_OpEntry); return NULL;
            }
            static TFL_PluginApi g_bench_api;
            TFL_EXPORT const TFL_PluginApi* torch_fl_plugin_get_api(const TFL_HostApi* host) {
              g_host = host; g_bench_api = g_api; g_bench_api.get_op_table = bench_get_op_table;
              return &g_bench_api;
            }
            """
        )
    )
    return "\n".join(lines)


REGISTER_SNIPPET = """
import time, torch, torch_fl
start, cpu = time.perf_counter(), time.process_time()
h = torch_fl.register_device_plugin(name="bench", plugin_path={path!r})
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
assert len(h.ops) == {n}, len(h.ops)
print(elapsed * 1e3, cpu * 1e3)
"""


def bench_register(runs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = Path(tmp) / "bench_plugin.c", Path(tmp) / "libtorchfl_bench.so"
        src.write_text(plugin_source(REGISTER_OPS))
        compile_plugin(src, lib)
        times, cpu_times = [], []
        for _ in range(runs):
            out = subprocess.run(
                [sys.executable, "-c", REGISTER_SNIPPET.format(path=str(lib), n=len(REGISTER_OPS))],
                check=True,
                capture_output=True,
                text=True,
            )
            wall, cpu = out.stdout.strip().splitlines()[-1].split()
            times.append(float(wall))
            cpu_times.append(float(cpu))
    # CPU time (all threads, the loading thread's included) is less
    # sensitive than wall time to other work on a shared machine.
    return {
        "ops": len(REGISTER_OPS),
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "median_cpu_ms": statistics.median(cpu_times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--register-runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {"add": bench_add(args.calls, args.repeats), "register": bench_register(args.register_runs)}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    add, reg = results["add"], results["register"]
    print(
        f"4-element torch.add: cpu {add['cpu_us']:.2f} µs, sim {add['device_us']:.2f} µs "
        f"(drained {add['device_drained_us']:.2f} µs): ratio {add['ratio']:.2f} (target <= 1.5)"
    )
    print(
        f"register a {reg['ops']}-op plugin: median {reg['median_ms']:.2f} ms, min {reg['min_ms']:.2f} ms, "
        f"CPU time median {reg['median_cpu_ms']:.2f} ms (target < 1 ms)"
    )


if __name__ == "__main__":
    main()
