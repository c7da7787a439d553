"""Whole models on the OpenCL device with no CPU fallback (``TORCH_FL_FALLBACK=error``).

A ResNet-18 training step (SGD with momentum, batch norm in training mode)
and the small GPT of :mod:`torch_fl.lm` (a training step with AdamW, then
greedy generation) run on the plugin's kernels alone, and their losses,
gradients, updated weights and tokens match the CPU's.

The ResNet-18 step uses 4 images of 64x64: at 32x32 a batch of two reaches
the last stage at 1x1, where batch norm over two values amplifies float32
rounding a thousandfold on the CPU itself (test_vision_models.py checks that
case in float64 on the simulator).
"""

from __future__ import annotations

import importlib.util

import pytest

from ._opencl import NEEDS_OPENCL, run

pytestmark = NEEDS_OPENCL

COMPARE = """
import copy
import torch.nn.functional as F

def compare(dev, cpu, what, step_atol=1e-5):
    # Gradients relative to each tensor's largest: a deep network's small
    # entries carry the rounding of the large ones.
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters(), strict=True):
        scale = p.grad.abs().max().item() + 1e-12
        torch.testing.assert_close(q.grad.cpu() / scale, p.grad / scale, rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{what}: grad of {name}: {m}")
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=step_atol,
                                   msg=lambda m: f"{what}: {name} after the step: {m}")
"""


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed")
def test_a_resnet18_training_step_runs_on_opencl_kernels_alone_and_matches_the_cpu() -> None:
    out = run(
        COMPARE
        + """
import torchvision
torch.manual_seed(0)
cpu = torchvision.models.resnet18(weights=None, num_classes=10)
dev = copy.deepcopy(cpu).to("ocl")
x, y = torch.randn(4, 3, 64, 64), torch.tensor([1, 3, 5, 7])
losses = []
for model, device in [(cpu, "cpu"), (dev, "ocl")]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    loss = F.cross_entropy(model(x.to(device)), y.to(device))
    loss.backward()
    opt.step()
    losses.append(loss.item())
assert abs(losses[0] - losses[1]) < 1e-5 * abs(losses[0]), losses
compare(dev, cpu, "resnet18")
for name, buf in cpu.named_buffers():  # batch norm's running statistics
    torch.testing.assert_close(dict(dev.named_buffers())[name].cpu(), buf, rtol=1e-4, atol=1e-5, msg=name)
dev.eval(); cpu.eval()
torch.testing.assert_close(dev(x.to("ocl")).cpu(), cpu(x), rtol=1e-4, atol=1e-4)
print("ok", torch_fl.fallback_stats())
""",
        timeout=420,
        TORCH_FL_FALLBACK="error",
    )
    assert out.strip() == "ok {}", out


def test_the_small_gpt_trains_and_generates_on_opencl_kernels_alone_and_matches_the_cpu() -> None:
    out = run(
        COMPARE
        + """
from torch_fl.lm import GPT, generate
torch.manual_seed(0)
cpu = GPT(vocab=64, width=32, heads=4, layers=2, context=16)
dev = copy.deepcopy(cpu).to("ocl")
tokens = torch.randint(0, 64, (4, 16))
losses = []
for model, device in [(cpu, "cpu"), (dev, "ocl")]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    t = tokens.to(device)
    logits = model(t[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 64), t[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    losses.append(loss.item())
assert abs(losses[0] - losses[1]) < 1e-5 * abs(losses[0]), losses
# Adam's first step moves each weight by lr * g / |g|: a gradient that is
# zero up to rounding on both devices (the key projection's bias: softmax
# ignores a constant shift) moves by +-lr on either, so the weights after
# the step agree to 2 * lr there, and everywhere else much closer.
compare(dev, cpu, "gpt", step_atol=2e-3)
cpu.eval(); dev.eval()
want = generate(cpu, tokens[:, :4], 12, greedy=True)
got = generate(dev, tokens[:, :4].to("ocl"), 12, greedy=True)
assert got.device.type == "ocl"
assert torch.equal(got.cpu(), want), (got.cpu(), want)
print("ok", torch_fl.fallback_stats())
""",
        timeout=420,
        TORCH_FL_FALLBACK="error",
    )
    assert out.strip() == "ok {}", out
