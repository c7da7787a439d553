"""The main job: train a torchvision ResNet (or a small GPT) on the bundled simulated accelerator.

Run ``python -m torch_fl.demo`` (``make demo`` does). It registers the
simulated accelerator, trains a ResNet on ``FakeData`` with a progress bar
showing loss and images/second, measures the same model's CPU throughput in
the same run, and reports how many operators fell back to the CPU. With
``--model gpt`` it trains a GPT-style language model (:class:`torch_fl.lm.GPT`)
on synthetic token sequences instead, in tokens/second, then generates from
it. The training code is plain PyTorch: only the device string differs.
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


def progress(step: int, steps: int, loss: float, rate: float, width: int = 30, unit: str = "img/s") -> None:
    """Draw a one-line progress bar on stderr."""
    done = int(width * step / steps)
    bar = "#" * done + "." * (width - done)
    sys.stderr.write(f"\r  [{bar}] {step}/{steps}  loss {loss:.4f}  {rate:7.1f} {unit}")
    sys.stderr.flush()


def token_batches(batch_size: int, context: int, vocab: int, steps: int, seed: int) -> Iterator[torch.Tensor]:
    """Yield ``steps`` batches of synthetic sequences, ``[batch, context + 1]`` tokens.

    Each sequence counts up from a random start with a random stride (modulo
    ``vocab``), so a language model can learn to continue it.
    """
    g = torch.Generator().manual_seed(seed)
    positions = torch.arange(context + 1)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch_size, 1), generator=g)
        stride = torch.randint(1, 4, (batch_size, 1), generator=g)
        yield (start + stride * positions) % vocab


def train_gpt(
    device: str, batch_size: int, context: int, steps: int, seed: int
) -> tuple[float, float, torch.nn.Module]:
    """Train a small GPT for ``steps`` steps on ``device``.

    Returns:
        (tokens/second after the first step, last loss, the model).
    """
    from .lm import GPT

    vocab = 128
    torch.manual_seed(seed)
    model = GPT(vocab=vocab, width=128, heads=4, layers=4, context=context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    model.train()
    start, loss_value, rate = None, float("nan"), 0.0
    for step, seqs in enumerate(token_batches(batch_size, context, vocab, steps, seed), start=1):
        seqs = seqs.to(device)
        inputs, targets = seqs[:, :-1], seqs[:, 1:]
        optimizer.zero_grad()
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = loss.item()
        if start is None:  # the first step includes one-time set-up
            start = time.perf_counter()
        else:
            rate = batch_size * context * (step - 1) / (time.perf_counter() - start)
        progress(step, steps, loss_value, rate, unit="tok/s")
    sys.stderr.write("\n")
    elapsed = time.perf_counter() - start if start is not None else 0.0
    return (batch_size * context * (steps - 1) / elapsed if elapsed > 0 else 0.0), loss_value, model


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
    parser.add_argument(
        "--model",
        default="resnet18",
        help="a torchvision model name, or gpt for a small language model (default: resnet18)",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--context", type=int, default=64, help="sequence length of --model gpt")
    parser.add_argument("--steps", type=int, default=40, help="training steps on the device")
    parser.add_argument("--cpu-steps", type=int, default=10, help="steps on the CPU to measure its throughput")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    handle = torch_fl.register_device_plugin(name="sim")
    print(
        f"{handle.name} {handle.plugin_version} (plugin ABI {handle.abi_version}) as torch device 'sim': "
        f"{handle.device_count} devices, {len(handle.ops)} operators, {', '.join(handle.capabilities)}"
    )
    if args.model == "gpt":
        _gpt_demo(args)
        return
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
    _report(sim_loss, fallbacks)


def _report(sim_loss: float, fallbacks: dict[str, int]) -> None:
    peak_mib = torch.accelerator.max_memory_allocated() / 2**20
    print(f"final loss on sim: {sim_loss:.4f}; peak device memory {peak_mib:.1f} MiB")
    print(f"fallback operators: {len(fallbacks)} ({sum(fallbacks.values())} calls)")
    for op, count in sorted(fallbacks.items(), key=lambda kv: -kv[1]):
        print(f"  {op:48s} {count}")


def _gpt_demo(args: argparse.Namespace) -> None:
    """``--model gpt``: train on sim and on the CPU, compare tokens/second, then generate on sim."""
    from .lm import generate

    print(f"training gpt on synthetic token sequences: batch {args.batch_size}, context {args.context}")
    torch_fl.reset_fallback_stats()
    print(f"on sim ({args.steps} steps):")
    sim_rate, sim_loss, model = train_gpt("sim", args.batch_size, args.context, args.steps, args.seed)
    prompt = next(token_batches(1, 7, 128, 1, args.seed + 1))
    sample = generate(model.eval(), prompt.to("sim"), 8, greedy=True, context=args.context).cpu()
    fallbacks = torch_fl.fallback_stats()
    print(f"on cpu ({args.cpu_steps} steps, same model and data):")
    cpu_rate, _, _ = train_gpt("cpu", args.batch_size, args.context, args.cpu_steps, args.seed)

    print(
        f"\nthroughput: sim {sim_rate:.1f} tok/s, cpu {cpu_rate:.1f} tok/s "
        f"(sim step time = {cpu_rate / sim_rate if sim_rate else float('inf'):.2f}x cpu)"
    )
    print(f"greedy continuation on sim: {prompt[0].tolist()} -> {sample[0, prompt.shape[1] :].tolist()}")
    _report(sim_loss, fallbacks)


if __name__ == "__main__":
    main()
