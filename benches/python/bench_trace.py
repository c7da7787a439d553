"""What the device trace costs: traced against untraced, in one run (a benchmark, not a test).

Measures, on the registered torch-fl device (the bundled simulator unless
``--plugin`` names another):

- a 4-element ``add``: microseconds per operator untraced, inside
  :func:`torch_fl.trace` (with the plugin's activity records when it has
  them, ABI 1.8), and untraced again after the trace (recording off in the
  plugin again);
- a ResNet-18 training step (batch 16, 64x64, SGD): milliseconds per step
  untraced and traced;
- how many calls and plugin records one traced add and one traced step
  make.

Every figure is the median of ``--rounds`` timed rounds. ``--json`` prints
one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

import torch_fl


def _median_us(
    run: Callable[[], None], items: int, rounds: int, around: Callable[[], AbstractContextManager[Any]]
) -> float:
    """Microseconds per item of ``run()`` (``items`` items), the median over ``rounds``, each inside ``around()``."""
    times = []
    for _ in range(rounds):
        torch.accelerator.synchronize()
        with around():
            start = time.perf_counter()
            run()
            torch.accelerator.synchronize()
            times.append((time.perf_counter() - start) / items * 1e6)
    return statistics.median(times)


@contextmanager
def _traced(counts: list[tuple[int, int]]) -> Iterator[None]:
    with torch_fl.trace() as t:
        yield
    counts.append((len(t.events), len(t.native)))


def measure_add(device: str, launches: int, rounds: int) -> dict[str, Any]:
    x = torch.ones(4, device=device)
    y = torch.ones(4, device=device)

    def run() -> None:
        for _ in range(launches):
            torch.add(x, y)

    run()  # warm up: output shapes, the caching allocator
    counts: list[tuple[int, int]] = []
    before = _median_us(run, launches, rounds, nullcontext)
    traced = _median_us(run, launches, rounds, lambda: _traced(counts))
    after = _median_us(run, launches, rounds, nullcontext)
    calls, records = counts[-1]
    return {
        "untraced_us": before,
        "traced_us": traced,
        "untraced_after_us": after,
        "traced_overhead_us": traced - before,
        "calls_per_add": calls / launches,
        "records_per_add": records / launches,
    }


def measure_resnet(device: str, steps: int, rounds: int) -> dict[str, Any]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(16, 3, 64, 64).to(device), torch.randint(0, 10, (16,)).to(device)

    def run() -> None:
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()

    run()
    counts: list[tuple[int, int]] = []
    untraced = _median_us(run, steps, rounds, nullcontext) / 1e3
    traced = _median_us(run, steps, rounds, lambda: _traced(counts)) / 1e3
    calls, records = counts[-1]
    return {
        "untraced_ms": untraced,
        "traced_ms": traced,
        "traced_ratio": traced / untraced,
        "calls_per_step": calls / steps,
        "records_per_step": records / steps,
        "overhead_us_per_call": (traced - untraced) * 1e3 / (calls / steps) if calls else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="sim", help="device name (default: sim)")
    parser.add_argument("--plugin", default=None, help="plugin library to register as --device")
    parser.add_argument("--launches", type=int, default=2000, help="adds per timed round")
    parser.add_argument("--steps", type=int, default=3, help="ResNet-18 steps per timed round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (medians reported)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    args = parser.parse_args()
    torch_fl.register_device_plugin(name=args.device, plugin_path=args.plugin)
    records, ranges = torch_fl._C.activity_status()
    result = {
        "device": args.device,
        "activity_records": records,
        "ranges": ranges,
        "add": measure_add(args.device, args.launches, args.rounds),
        "resnet18_train": measure_resnet(args.device, args.steps, args.rounds),
    }
    add, resnet = result["add"], result["resnet18_train"]
    print(f"device {args.device}: activity records {'yes' if records else 'no (timing events)'}")
    print(
        f"4-element add: {add['untraced_us']:.2f} us untraced, {add['traced_us']:.2f} us traced "
        f"(+{add['traced_overhead_us']:.2f} us; {add['records_per_add']:.1f} plugin records per add), "
        f"{add['untraced_after_us']:.2f} us untraced after the trace"
    )
    print(
        f"ResNet-18 step: {resnet['untraced_ms']:.1f} ms untraced, {resnet['traced_ms']:.1f} ms traced "
        f"(x{resnet['traced_ratio']:.2f}; {resnet['calls_per_step']:.0f} calls and "
        f"{resnet['records_per_step']:.0f} plugin records per step)"
    )
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
