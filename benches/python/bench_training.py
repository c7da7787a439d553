"""ResNet training-step time on the simulated device against the CPU (a benchmark, not a test).

Measures, in one process with the same model, data and optimizer:

- the median training-step time (forward, loss, backward, SGD step with
  momentum, ``loss.item()``) on the simulated device and on the CPU, and
  their ratio (target: at most 2);
- the share of the device step spent in torch-fl's own layers outside the
  kernels, from :func:`torch_fl.profile_layers` (target: under 1%);
- how many operators fell back to the CPU (expected: none).

Run ``make bench-python`` or ``python benches/python/bench_training.py``
(``--help`` for the model, batch, image size and step count; ``--json`` for
machine-readable output). Figures go in benches/README.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
import torchvision

import torch_fl


def step_times(model: torch.nn.Module, device: str, batch: int, image: int, steps: int, warmup: int) -> list[float]:
    """Seconds per training step, after ``warmup`` untimed steps."""
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(batch, 3, image, image, generator=g), torch.randint(0, 10, (batch,), generator=g))
        for _ in range(4)
    ]
    model = model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    times = []
    for i in range(warmup + steps):
        x, y = data[i % len(data)]
        start = time.perf_counter()
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()  # waits for the device
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    torch_fl.register_device_plugin(name="sim")
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=10)
    shape = (args.batch_size, args.image_size, args.steps, args.warmup)

    cpu = statistics.median(step_times(copy.deepcopy(model), "cpu", *shape))
    torch_fl.reset_fallback_stats()
    sim = statistics.median(step_times(copy.deepcopy(model), "sim", *shape))
    fallbacks = torch_fl.fallback_stats()
    # The profiled run is separate, so the timing above carries no clock reads.
    with torch_fl.profile_layers() as profile:
        step_times(copy.deepcopy(model), "sim", args.batch_size, args.image_size, args.steps, 0)

    result = {
        "model": args.model,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "cpu_step_ms": cpu * 1e3,
        "sim_step_ms": sim * 1e3,
        "ratio": sim / cpu,
        "layer_share": profile.layer_share,
        "layer_us_per_entry": profile.layer_s / max(profile.entries, 1) * 1e6,
        "entries_per_step": profile.entries / args.steps,
        "fallback_calls": sum(fallbacks.values()),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{args.model}, batch {args.batch_size}, {args.image_size}x{args.image_size}: "
        f"step cpu {result['cpu_step_ms']:.1f} ms, sim {result['sim_step_ms']:.1f} ms: "
        f"ratio {result['ratio']:.2f} (target <= 2)"
    )
    print(
        f"torch-fl layers outside kernels: {result['layer_share']:.3%} of the step "
        f"({result['entries_per_step']:.0f} operator entries per step, "
        f"{result['layer_us_per_entry']:.2f} us each; target < 1%)"
    )
    print(f"CPU fallbacks: {result['fallback_calls']} calls {sorted(fallbacks)}")


if __name__ == "__main__":
    main()
