"""ResNet training-step time on the simulated device against the CPU (a benchmark, not a test).

Measures, in one process with the same model, data and optimizer:

- the median training-step time (forward, loss, backward, SGD step with
  momentum, ``loss.item()``) on the simulated device and on the CPU, and
  their ratio (target: at most 2);
- the share of the device step spent in torch-fl's own layers outside the
  kernels, from :func:`torch_fl.profile_layers` (target: under 0.2%), and,
  where the build reports it, the share spent inside the plugin's
  ``allocate``/``deallocate`` calls;
- how many operators fell back to the CPU (expected: none).

Run ``make bench-python`` or ``python benches/python/bench_training.py``
(``--help`` for the model, batch, image size, step count and how inputs
are transferred; ``--json`` for machine-readable output).
``benches/python/bench_all.py`` runs it under several configurations.
Figures go in benches/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time

import torch

try:
    import torchvision
except ImportError as e:  # a torch release no torchvision pairs with yet
    raise SystemExit(
        f"bench_training.py needs torchvision for ResNet-18 ({e}); "
        "install the torchvision release paired with your torch"
    ) from e

import torch_fl


def _batches(batch: int, image: int, pinned: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(batch, 3, image, image, generator=g), torch.randint(0, 10, (batch,), generator=g))
        for _ in range(4)
    ]
    if pinned:  # what DataLoader(pin_memory=True) hands out
        data = [(x.pin_memory(), y.pin_memory()) for x, y in data]
    return data


def step_times(
    model: torch.nn.Module,
    device: str,
    batch: int,
    image: int,
    steps: int,
    warmup: int,
    transfer: str = "sync",
    profile: bool = False,
) -> tuple[list[float], torch_fl.LayerProfile | None]:
    """Seconds per training step after ``warmup`` untimed steps, and the layer profile of the timed steps.

    ``transfer``: ``"sync"`` copies each batch with ``x.to(device)`` from
    pageable memory inside the step; ``"async"`` keeps the batches pinned and
    issues the next batch's ``non_blocking`` copy before the current step's
    compute, as a prefetching input pipeline does, so the copy can overlap
    the step. Both count the copies in the step time. ``profile``: time the
    steps under :func:`torch_fl.profile_layers` (its clock reads included).
    """
    asynchronous = transfer == "async" and device != "cpu"
    data = _batches(batch, image, pinned=asynchronous)
    model = model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss().to(device)

    def fetch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = data[i % len(data)]
        return x.to(device, non_blocking=asynchronous), y.to(device, non_blocking=asynchronous)

    def step(i: int, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
        x, y = inputs
        upcoming = fetch(i + 1) if asynchronous else None  # before this step's compute
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()  # waits for the device
        return upcoming

    prefetched = fetch(0) if asynchronous else None
    for i in range(warmup):
        prefetched = step(i, prefetched if asynchronous else fetch(i))
    times = []
    context = torch_fl.profile_layers() if profile else contextlib.nullcontext()
    with context as layers:
        for i in range(warmup, warmup + steps):
            start = time.perf_counter()
            prefetched = step(i, prefetched if asynchronous else fetch(i))
            times.append(time.perf_counter() - start)
    return times, layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", "--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--input-transfer",
        choices=("sync", "async"),
        default="sync",
        help="sync: x.to(device) from pageable memory in the step; async: pinned batches, the next one copied "
        "with non_blocking=True before the current step's compute (a prefetcher)",
    )
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU baseline (device figures only)")
    parser.add_argument("--no-profile", action="store_true", help="skip the layer-profiled run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    torch_fl.register_device_plugin(name="sim")
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=10)
    shape = (args.batch_size, args.image_size, args.steps, args.warmup)

    cpu = None if args.no_cpu else statistics.median(step_times(copy.deepcopy(model), "cpu", *shape)[0])
    torch_fl.reset_fallback_stats()
    sim = statistics.median(step_times(copy.deepcopy(model), "sim", *shape, transfer=args.input_transfer)[0])
    fallbacks = torch_fl.fallback_stats()
    result: dict[str, object] = {
        "model": args.model,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "input_transfer": args.input_transfer,
        "cpu_step_ms": None if cpu is None else cpu * 1e3,
        "sim_step_ms": sim * 1e3,
        "ratio": None if cpu is None else sim / cpu,
        "fallback_calls": sum(fallbacks.values()),
    }
    top_operators: list[dict[str, object]] = []
    if not args.no_profile:
        # A separate run, so the timing above carries no clock reads; the
        # profile covers the timed steps only (not model set-up).
        _, profile = step_times(copy.deepcopy(model), "sim", *shape, transfer=args.input_transfer, profile=True)
        assert profile is not None
        # Where the layer time goes: the operators with the most of it.
        top_operators = [
            {
                "operator": name,
                "entries_per_step": op.entries / args.steps,
                "layer_us_per_entry": op.layer_s / op.entries * 1e6,
                "layer_pct": op.layer_s / profile.layer_s * 100 if profile.layer_s > 0 else 0.0,
            }
            for name, op in profile.top_operators(6)
        ]
        alloc_s = profile.alloc_s  # inside the plugin's allocate/deallocate calls
        result.update(
            {
                "profiled_step_ms": profile.wall_s / args.steps * 1e3,
                "layer_share": profile.layer_share,
                "layer_us_per_entry": profile.layer_s / max(profile.entries, 1) * 1e6,
                "entries_per_step": profile.entries / args.steps,
                "alloc_share": alloc_s / profile.wall_s,
                "alloc_calls_per_step": profile.alloc_calls / args.steps,
                "alloc_us_per_entry": alloc_s / max(profile.entries, 1) * 1e6,
                "layer_top_operators": top_operators,
            }
        )
    if args.json:
        print(json.dumps(result, indent=2))
        return
    ratio = "" if cpu is None else f"cpu {cpu * 1e3:.1f} ms, "
    print(
        f"{args.model}, batch {args.batch_size}, {args.image_size}x{args.image_size}, {args.input_transfer} input "
        f"transfers: step {ratio}sim {sim * 1e3:.1f} ms"
        + ("" if cpu is None else f": ratio {sim / cpu:.2f} (target <= 2)")
    )
    if "layer_share" in result:
        print(
            f"torch-fl layers outside kernels: {result['layer_share']:.3%} of the step "
            f"({result['entries_per_step']:.0f} operator entries per step, "
            f"{result['layer_us_per_entry']:.2f} us each; target < 0.2%)"
        )
        for row in top_operators:
            print(
                f"  {row['operator']}: {row['layer_pct']:.0f}% of it, {row['entries_per_step']:.0f} per step, "
                f"{row['layer_us_per_entry']:.2f} us each"
            )
        if result.get("alloc_share") is not None:
            print(f"inside the plugin's allocate/deallocate: {result['alloc_share']:.3%} of the step")
    print(f"CPU fallbacks: {result['fallback_calls']} calls {sorted(fallbacks)}")


if __name__ == "__main__":
    main()
