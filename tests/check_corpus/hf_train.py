"""Fine-tune a small classifier, Hugging Face Trainer style (CUDA-only as written).

The loop logs "cuda" in messages and mentions cuda in this docstring: neither is reported.
"""

import logging
import math

import torch
from torch import nn
from torch.cuda.amp import GradScaler, autocast
from torch.utils.data import DataLoader, TensorDataset

logger = logging.getLogger(__name__)


class TrainingArguments:
    def __init__(self, lr: float = 3e-4, epochs: int = 2, device: str = "cuda") -> None:  # expect: FL001
        self.lr = lr
        self.epochs = epochs
        self.device = device
        self.fp16 = torch.cuda.is_available()  # expect: FL020


def set_seed(seed: int) -> None:
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)  # expect: FL026
    torch.backends.cudnn.deterministic = True  # expect: FL041


def train(args: TrainingArguments) -> float:
    set_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    model.cuda()  # expect: FL010
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, pin_memory=torch.cuda.is_available())  # expect: FL006
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = GradScaler(enabled=args.fp16)  # expect: FL028
    logger.info("training on cuda with fp16=%s", args.fp16)
    loss = torch.tensor(math.inf)
    for epoch in range(args.epochs):
        for inputs, labels in loader:
            inputs = inputs.to(args.device, non_blocking=True)
            labels = labels.cuda(non_blocking=True)  # expect: FL010
            with autocast(enabled=args.fp16):  # expect: FL028
                loss = nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        peak = torch.cuda.max_memory_allocated() / 2**20  # expect: FL023
        print(f"epoch {epoch}: loss {loss.item():.3f}, peak cuda memory {peak:.0f} MiB")
    torch.cuda.empty_cache()  # expect: FL023
    return loss.item()


if __name__ == "__main__":
    train(TrainingArguments())
