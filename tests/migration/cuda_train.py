"""A third-party training script that hard-codes CUDA everywhere (do not edit: tests/test_migrate.py runs it).

It is written the way many published scripts are: "cuda" strings, ``.cuda()``,
``torch.cuda.*`` calls, the deprecated ``torch.cuda.amp`` API and a checkpoint
loaded with ``map_location="cuda"``. It prints a JSON summary on its last line.
"""

import io
import json

import torch
from torch import nn
from torch.cuda.amp import GradScaler
from torch.utils.data import DataLoader, TensorDataset

torch.cuda.manual_seed_all(0)
torch.manual_seed(0)
device = torch.device("cuda")
torch.cuda.set_device(0)

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = GradScaler(enabled=False)
inputs = torch.randn(64, 8)
targets = inputs.sum(dim=1, keepdim=True)
loader = DataLoader(TensorDataset(inputs, targets), batch_size=16)

stream = torch.cuda.Stream()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
losses = []
for _epoch in range(5):
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.to("cuda")
        with torch.autocast(device_type="cuda", enabled=False):
            loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    losses.append(loss.item())
end.record()
torch.cuda.synchronize()

bias = torch.zeros(1, device="cuda:0")
buffer = io.BytesIO()
torch.save(model.state_dict(), buffer)
buffer.seek(0)
state = torch.load(buffer, map_location="cuda")

print(
    json.dumps(
        {
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "param_device": str(next(model.parameters()).device),
            "bias_device": str(bias.device),
            "loaded_device": str(next(iter(state.values())).device),
            "stream_device": str(stream.device),
            "allocated": torch.cuda.memory_allocated(),
            "cuda_available": torch.cuda.is_available(),
        }
    )
)
