"""The OpenCL plugin against the simulator and the CPU: launch overhead, GEMM, and where a ResNet-18 step goes.

Measures, each device in a process of its own (one torch-fl device per
process), with medians over ``--rounds``:

- per-launch overhead: a 4-element ``a + b`` from Python, synchronized once
  at the end of ``--launches`` calls, in microseconds per call; on the plugin
  devices also the part spent inside the plugin's kernel entry (the OpenCL
  plugin's argument setting and ``clEnqueueNDRangeKernel``), from
  ``torch_fl.profile_layers``;
- GEMM: ``a @ b`` for square float32 matrices, in GFLOP/s;
- on ``ocl``: a ResNet-18 training step (16 images of 64x64, SGD) and the
  bench CLI's GPT training step (AdamW): the first
  step of the process (which builds every OpenCL program it needs, also
  with PoCL's on-disk kernel cache off) against the steady one, and the
  operators taking the most of a step's device time (``torch_fl.trace``:
  the plugin's timing events around each call).

The model step times of all three devices in one run come from
``python -m torch_fl bench --devices ocl,sim,cpu``. Run
``python benches/python/bench_opencl.py`` (``--json`` for machine-readable
output); figures go in benches/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "target" / "release" / "libtorchfl_opencl.so"
DEVICES = ("ocl", "sim", "cpu")


def _sync(torch: Any, device: str) -> None:
    if device != "cpu":
        torch.accelerator.synchronize()


def _launch(torch: Any, torch_fl: Any, device: str, launches: int, rounds: int) -> dict[str, float]:
    a = torch.ones(4, device=device)
    b = torch.ones(4, device=device)
    for _ in range(200):
        a + b
    _sync(torch, device)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(launches):
            a + b
        _sync(torch, device)
        times.append((time.perf_counter() - start) / launches * 1e6)
    out = {"us_per_add": statistics.median(times)}
    if device != "cpu":
        with torch_fl.profile_layers() as p:
            for _ in range(launches):
                a + b
        out["us_in_plugin_kernel_entry"] = p.kernel_s / max(p.kernel_calls, 1) * 1e6
    return out


def _gemm(torch: Any, device: str, sizes: list[int], rounds: int) -> dict[str, float]:
    out = {}
    for n in sizes:
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        a @ b
        _sync(torch, device)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            a @ b
            _sync(torch, device)
            times.append(time.perf_counter() - start)
        out[str(n)] = 2 * n**3 / statistics.median(times) / 1e9
    return out


def _resnet18(torch: Any, device: str) -> tuple[Any, Any, Any, Any]:
    import torchvision

    model = torchvision.models.resnet18(weights=None, num_classes=10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(16, 3, 64, 64).to(device), torch.randint(0, 10, (16,)).to(device)
    return model, opt, x, y


def _gpt(torch: Any, device: str) -> tuple[Any, Any, Any, Any]:
    """The bench CLI's GPT: batch 8, context 64, width 128, 4 layers, vocabulary 256."""
    from torch_fl.lm import GPT

    model = GPT(vocab=256, width=128, heads=4, layers=4, context=64).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 256, (8, 65)).to(device)
    return model, opt, tokens[:, :-1], tokens[:, 1:]


def _step_profile(torch: Any, torch_fl: Any, device: str, steps: int, workload: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model, opt, x, y = (_resnet18 if workload == "resnet18" else _gpt)(torch, device)

    def step() -> float:
        start = time.perf_counter()
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        return time.perf_counter() - start

    first = step()
    steady = statistics.median(step() for _ in range(steps))
    # Device time per operator, from the plugin's timing events around each
    # call (the kernels run asynchronously: host-side timing would only see
    # the enqueue).
    with torch_fl.trace() as t:
        traced = step()
    device_us: dict[str, float] = {}
    for e in t.events:
        device_us[e.name] = device_us.get(e.name, 0.0) + (e.device_us or 0.0)
    total = sum(device_us.values())
    top = sorted(device_us.items(), key=lambda kv: -kv[1])[:8]
    return {
        "first_step_s": first,
        "steady_step_s": steady,
        "traced_step_s": traced,
        "device_s": total / 1e6,
        "top_operators_device_share": {name: round(us / total, 3) for name, us in top},
        "calls": len(t.events),
    }


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import torch_fl

    if args.device == "ocl":
        torch_fl.register_device_plugin(name="ocl", plugin_path=str(PLUGIN))
    elif args.device == "sim":
        torch_fl.register_device_plugin(name="sim")
    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {
        "launch": _launch(torch, torch_fl, args.device, args.launches, args.rounds),
        "gemm_gflops": _gemm(torch, args.device, [256, 512, 1024], args.rounds),
    }
    if args.device == "ocl":
        for workload in ("resnet18", "gpt"):
            result[f"{workload}_train"] = _step_profile(torch, torch_fl, args.device, args.steps, workload)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=2000, help="adds per timed round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (medians reported)")
    parser.add_argument("--steps", type=int, default=3, help="steady ResNet-18 steps on ocl")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--device", choices=DEVICES, help=argparse.SUPPRESS)  # a child's own device
    args = parser.parse_args()
    if args.device:
        print(json.dumps(child(args)))
        return
    report = {}
    for device in DEVICES:
        command = [sys.executable, __file__, "--device", device]
        command += ["--launches", str(args.launches), "--rounds", str(args.rounds)]
        command += ["--steps", str(args.steps), "--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=True)
        report[device] = json.loads(done.stdout.strip().splitlines()[-1])
    # The same, with PoCL's on-disk kernel cache off: every program the
    # first ResNet-18 step needs is compiled in that step.
    command = [sys.executable, __file__, "--device", "ocl", "--launches", "10", "--rounds", "1", "--steps", "1"]
    env = {**os.environ, "POCL_KERNEL_CACHE": "0"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=True, env=env)
    cold = json.loads(done.stdout.strip().splitlines()[-1])["resnet18_train"]
    report["ocl"]["resnet18_train"]["first_step_cold_cache_s"] = cold["first_step_s"]
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for device, r in report.items():
        launch = r["launch"]
        inside = launch.get("us_in_plugin_kernel_entry")
        entry = f", {inside:.1f} inside the plugin's kernel entry" if inside is not None else ""
        gemm = ", ".join(f"{n}: {g:.1f}" for n, g in r["gemm_gflops"].items())
        print(f"{device}: 4-element add {launch['us_per_add']:.1f} us/call{entry}; GEMM GFLOP/s {gemm}")
        for workload in ("resnet18", "gpt"):
            if f"{workload}_train" not in r:
                continue
            s = r[f"{workload}_train"]
            cold = s.get("first_step_cold_cache_s")
            print(
                f"  {workload} train step: first {s['first_step_s']:.2f} s"
                + (f" ({cold:.2f} s with PoCL's kernel cache off)" if cold is not None else "")
                + f", steady {s['steady_step_s']:.2f} s, device time {s['device_s']:.2f} s over {s['calls']} calls; "
                f"shares: {s['top_operators_device_share']}"
            )


if __name__ == "__main__":
    main()
