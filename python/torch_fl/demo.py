"""The main job: PyTorch on the bundled simulated accelerator.

Run ``python -m torch_fl.demo`` (``make demo`` does). It registers the
simulated accelerator, shows what PyTorch now sees, trains a small model on
the device and on the CPU from the same seed, compares the losses, and
reports which operators fell back to the CPU.
"""

from __future__ import annotations

import argparse
import time

import torch

import torch_fl


def train(device: str, steps: int, seed: int) -> tuple[list[float], float]:
    """Train a small classifier on synthetic data; return losses and seconds."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
    )
    data = torch.randn(256, 32)
    labels = (data[:, :4].argmax(dim=1)).long()
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - start


def main() -> None:
    """Entry point of ``python -m torch_fl.demo``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps on each device")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    handle = torch_fl.register_device_plugin(name="sim")
    print(handle)
    for i, props in enumerate(handle.devices):
        print(f"  sim:{i}: {props['name']}, {props['total_memory'] >> 20} MiB")
    print(f"  capabilities: {', '.join(handle.capabilities)}; {len(handle.ops)} operators")
    print(f"  torch.accelerator: {torch.accelerator.current_accelerator()}, {torch.accelerator.device_count()} devices")

    x = torch.randn(2, 3)
    y = x.to("sim")
    print(
        f"\nx.to('sim') -> {y.device}; (y * 2 + 1).relu() on sim matches the CPU: "
        f"{torch.allclose((y * 2 + 1).relu().cpu(), (x * 2 + 1).relu())}"
    )

    torch_fl.reset_fallback_stats()
    dev_losses, dev_time = train("sim", args.steps, args.seed)
    cpu_losses, cpu_time = train("cpu", args.steps, args.seed)
    print(f"\ntraining {args.steps} steps (same seed):")
    for step in sorted({0, args.steps // 2, args.steps - 1}):
        print(f"  step {step:3d}: loss sim {dev_losses[step]:.5f}   cpu {cpu_losses[step]:.5f}")
    worst = max(abs(a - b) for a, b in zip(dev_losses, cpu_losses))
    print(f"  largest loss difference: {worst:.2e}; time sim {dev_time:.2f} s, cpu {cpu_time:.2f} s")
    print(f"  peak device memory: {torch.sim.max_memory_allocated() / 1024:.0f} KiB")

    stats = torch_fl.fallback_stats()
    print(f"\noperators that ran on the CPU fallback: {sum(stats.values())} calls of {len(stats)} operators")
    for op, count in sorted(stats.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {op:40s} {count}")


if __name__ == "__main__":
    main()
