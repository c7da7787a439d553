"""Mixed precision on the device: torch.autocast's per-operator policy and GradScaler."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_fl

from .conftest import DEVICE, HANDLE, NO_TORCHVISION

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

LOW = [torch.bfloat16, torch.float16]


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(DEVICE)


@pytest.mark.parametrize("dtype", LOW)
def test_matmul_and_convolution_families_run_in_the_autocast_dtype(dtype: torch.dtype) -> None:
    a, b = rand(4, 8), rand(8, 3)
    linear = torch.nn.Linear(8, 3).to(DEVICE)
    conv = torch.nn.Conv2d(2, 4, 3).to(DEVICE)
    images = rand(1, 2, 6, 6)
    with torch.autocast(device_type=DEVICE, dtype=dtype):
        assert torch.mm(a, b).dtype == dtype
        assert torch.matmul(a, b).dtype == dtype
        assert linear(a).dtype == dtype
        assert conv(images).dtype == dtype
        assert torch.bmm(a[None], b[None]).dtype == dtype
    # Outside the context nothing is cast.
    assert torch.mm(a, b).dtype == torch.float32
    assert linear(a).dtype == torch.float32


@pytest.mark.parametrize("dtype", LOW)
def test_softmax_losses_and_norms_run_in_float32(dtype: torch.dtype) -> None:
    low = rand(4, 8).to(dtype)
    target = torch.tensor([0, 1, 2, 3]).to(DEVICE)
    with torch.autocast(device_type=DEVICE, dtype=dtype):
        assert torch.softmax(low, dim=1).dtype == torch.float32
        assert torch.log_softmax(low, dim=1).dtype == torch.float32
        assert F.cross_entropy(low, target).dtype == torch.float32
        assert F.nll_loss(low, target).dtype == torch.float32
        assert F.layer_norm(low, (8,)).dtype == torch.float32
        assert low.sum().dtype == torch.float32
    # Outside the context the input dtype stays.
    assert torch.softmax(low, dim=1).dtype == dtype


def test_mixed_dtype_operators_promote_to_the_widest_input() -> None:
    full, low = rand(5), rand(5).to(torch.bfloat16)
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
        assert torch.addcmul(full, low, low).dtype == torch.float32


def test_the_offered_dtypes_come_from_the_plugin_capabilities() -> None:
    assert {"float16", "bfloat16"} <= set(HANDLE.capabilities)
    assert set(getattr(torch, DEVICE).get_amp_supported_dtype()) == {torch.float16, torch.bfloat16}


def test_unsupported_dtypes_warn_and_disable_autocast() -> None:
    assert torch.float64 not in getattr(torch, DEVICE).get_amp_supported_dtype()
    a = rand(2, 2)
    with pytest.warns(UserWarning, match="target dtype is not supported"):
        with torch.autocast(device_type=DEVICE, dtype=torch.float64):
            assert torch.mm(a, a).dtype == torch.float32


def test_grad_scaler_skips_a_step_with_an_inf_gradient_and_backs_off() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(DEVICE, init_scale=1024.0)
    x = rand(3, 4)

    scaler.scale(model(x).sum()).backward()
    before = model.weight.detach().cpu().clone()
    model.weight.grad[0, 0] = float("inf")
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(model.weight.detach().cpu(), before), "the step with an inf gradient was skipped"
    assert scaler.get_scale() == 512.0

    optimizer.zero_grad()
    scaler.scale(model(x).sum()).backward()
    grad = model.weight.grad.detach().cpu() / 512.0  # what the unscaled gradient will be
    scaler.step(optimizer)
    scaler.update()
    torch.testing.assert_close(model.weight.detach().cpu(), before - 0.1 * grad)
    assert scaler.get_scale() == 512.0


def resnet_losses(steps: int, autocast_dtype: torch.dtype | None, scaler: bool = False) -> list[float]:
    torchvision = pytest.importorskip("torchvision", reason=NO_TORCHVISION)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9)
    grad_scaler = torch.amp.GradScaler(DEVICE, init_scale=1024.0, enabled=scaler)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 32, 32, generator=g).to(DEVICE)
    y = torch.randint(0, 10, (8,), generator=g).to(DEVICE)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        with torch.autocast(DEVICE, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = F.cross_entropy(model(x), y)
        grad_scaler.scale(loss).backward()
        grad_scaler.step(optimizer)
        grad_scaler.update()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(
    ("dtype", "scaler", "rtol"),
    # bfloat16 keeps 8 bits of mantissa, float16 11: the curves drift apart
    # by about 10% and 1% over these steps.
    [(torch.bfloat16, False, 0.15), (torch.float16, True, 0.03)],
)
def test_resnet18_under_autocast_follows_the_float32_loss_curve(dtype: torch.dtype, scaler: bool, rtol: float) -> None:
    torch_fl.reset_fallback_stats()
    low = resnet_losses(4, dtype, scaler)
    assert torch_fl.fallback_stats() == {}, "every autocast and GradScaler kernel ran on the device"
    full = resnet_losses(4, None)
    assert low[-1] < low[0] / 4, f"the loss falls under autocast: {low}"
    torch.testing.assert_close(torch.tensor(low), torch.tensor(full), rtol=rtol, atol=0.01)
