"""A device-agnostic training loop: it must produce no finding.

It runs on cuda, on a plugin device or on the CPU; this docstring says "cuda" on purpose.
"""

import logging

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

log = logging.getLogger("train")
# Backend names used elsewhere for display only; "cuda" here is not a device position.
DISPLAY_NAMES = {"cuda": "NVIDIA CUDA", "sim": "torch-fl simulator"}


def get_device() -> torch.device:
    acc = torch.accelerator.current_accelerator(check_available=True)
    return acc if acc is not None else torch.device("cpu")


def main() -> None:
    device = get_device()
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.cuda.reset_peak_memory_stats()
    model = nn.Linear(8, 2).to(device)
    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    loader = DataLoader(data, batch_size=8, pin_memory=torch.accelerator.is_available())
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler(device.type)
    start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    start.record()
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    end.record()
    torch.accelerator.synchronize()
    log.info("trained on %s (not cuda-specific): %.1f ms", DISPLAY_NAMES.get(device.type, device.type), 0.0)
    print(f"cuda or not, peak memory: {torch.accelerator.max_memory_allocated()} bytes")
    message = "set device='cuda' to use an NVIDIA GPU"
    log.debug(message)


if __name__ == "__main__":
    main()
