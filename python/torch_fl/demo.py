"""The main job: train a torchvision ResNet on the bundled simulated accelerator.

Run ``python -m torch_fl.demo`` (``make demo`` does). It registers the
simulated accelerator, trains a ResNet on ``FakeData`` with a progress bar
showing loss and images/second, measures the same model's CPU throughput in
the same run, and reports how many operators fell back to the CPU. The
training code is plain PyTorch: only the device string differs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator

import torch

import torch_fl

Batch = tuple[torch.Tensor, torch.Tensor]


def fake_batches(batch_size: int, image_size: int, steps: int, seed: int) -> Iterator[Batch]:
    """Yield ``steps`` batches of torchvision ``FakeData`` through a DataLoader."""
    import torchvision

    dataset = torchvision.datasets.FakeData(
        size=batch_size * steps,
        image_size=(3, image_size, image_size),
        num_classes=10,
        transform=torchvision.transforms.ToTensor(),
        random_offset=seed,
    )
    yield from torch.utils.data.DataLoader(dataset, batch_size=batch_size, pin_memory=True)


def progress(step: int, steps: int, loss: float, images_per_s: float, width: int = 30) -> None:
    """Draw a one-line progress bar on stderr."""
    done = int(width * step / steps)
    bar = "#" * done + "." * (width - done)
    sys.stderr.write(f"\r  [{bar}] {step}/{steps}  loss {loss:.4f}  {images_per_s:7.1f} img/s")
    sys.stderr.flush()


def train(model_name: str, device: str, batch_size: int, image_size: int, steps: int, seed: int) -> tuple[float, float]:
    """Train ``steps`` steps on ``device``; return (images/second after the first step, last loss)."""
    import torchvision

    torch.manual_seed(seed)
    model = getattr(torchvision.models, model_name)(weights=None, num_classes=10).to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    start, loss_value = None, float("nan")
    for step, (images, labels) in enumerate(fake_batches(batch_size, image_size, steps, seed), start=1):
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        optimizer.zero_grad()
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        if start is None:  # the first step includes one-time set-up
            start = time.perf_counter()
            rate = 0.0
        else:
            rate = batch_size * (step - 1) / (time.perf_counter() - start)
        progress(step, steps, loss_value, rate)
    sys.stderr.write("\n")
    elapsed = time.perf_counter() - start if start is not None else 0.0
    return (batch_size * (steps - 1) / elapsed if elapsed > 0 else 0.0), loss_value


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m torch_fl.demo``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", help="a torchvision model name (default: resnet18)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40, help="training steps on the device")
    parser.add_argument("--cpu-steps", type=int, default=10, help="steps on the CPU to measure its throughput")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    handle = torch_fl.register_device_plugin(name="sim")
    print(
        f"{handle.name} {handle.plugin_version} (plugin ABI {handle.abi_version}) as torch device 'sim': "
        f"{handle.device_count} devices, {len(handle.ops)} operators, {', '.join(handle.capabilities)}"
    )
    print(f"training {args.model} on FakeData: batch {args.batch_size}, {args.image_size}x{args.image_size} images")

    torch_fl.reset_fallback_stats()
    print(f"on sim ({args.steps} steps):")
    sim_rate, sim_loss = train(args.model, "sim", args.batch_size, args.image_size, args.steps, args.seed)
    fallbacks = torch_fl.fallback_stats()
    print(f"on cpu ({args.cpu_steps} steps, same model and data):")
    cpu_rate, _ = train(args.model, "cpu", args.batch_size, args.image_size, args.cpu_steps, args.seed)

    print(
        f"\nthroughput: sim {sim_rate:.1f} img/s, cpu {cpu_rate:.1f} img/s "
        f"(sim step time = {cpu_rate / sim_rate if sim_rate else float('inf'):.2f}x cpu)"
    )
    peak_mib = torch.accelerator.max_memory_allocated() / 2**20
    print(f"final loss on sim: {sim_loss:.4f}; peak device memory {peak_mib:.1f} MiB")
    print(f"fallback operators: {len(fallbacks)} ({sum(fallbacks.values())} calls)")
    for op, count in sorted(fallbacks.items(), key=lambda kv: -kv[1]):
        print(f"  {op:48s} {count}")


if __name__ == "__main__":
    main()
