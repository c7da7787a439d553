"""Factory functions create tensors directly on the device."""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICE, assert_close

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


@pytest.mark.parametrize("index", [0, 1])
def test_constant_factories(index: int) -> None:
    dev = f"{DEVICE}:{index}"
    assert_close(torch.zeros(2, 3, device=dev), torch.zeros(2, 3))
    assert_close(torch.ones(4, dtype=torch.int64, device=dev), torch.ones(4, dtype=torch.int64))
    assert_close(torch.full((2, 2), 7.5, device=dev), torch.full((2, 2), 7.5))
    assert torch.zeros(1, device=dev).device == torch.device(dev)


def test_empty_has_the_requested_metadata() -> None:
    e = torch.empty(3, 4, dtype=torch.float16, device=DEVICE)
    assert (e.shape, e.dtype, e.device) == (torch.Size([3, 4]), torch.float16, torch.device("sim:0"))
    s = torch.empty_strided((2, 3), (1, 2), device=DEVICE)
    assert s.stride() == (1, 2)


def test_arange_matches_cpu() -> None:
    assert_close(torch.arange(10, device=DEVICE), torch.arange(10))
    assert_close(torch.arange(0, 1, 0.25, device=DEVICE), torch.arange(0, 1, 0.25))


def test_random_factories_have_the_right_shape_and_statistics() -> None:
    torch.manual_seed(0)
    r = torch.randn(1000, device=DEVICE)
    assert r.shape == (1000,) and r.device.type == DEVICE
    cpu = r.cpu()
    assert abs(cpu.mean().item()) < 0.2 and 0.8 < cpu.std().item() < 1.2
    u = torch.rand(1000, device=DEVICE).cpu()
    assert 0.0 <= u.min().item() and u.max().item() < 1.0


def test_seeded_random_factories_are_reproducible() -> None:
    torch.manual_seed(1234)
    a = torch.randn(8, device=DEVICE).cpu()
    torch.manual_seed(1234)
    b = torch.randn(8, device=DEVICE).cpu()
    torch.testing.assert_close(a, b)


def test_like_factories_keep_the_device() -> None:
    x = torch.ones(2, 2, device=DEVICE)
    for y in (torch.zeros_like(x), torch.ones_like(x), torch.empty_like(x), torch.full_like(x, 3.0)):
        assert y.device == x.device and y.shape == x.shape


def test_device_tensors_print() -> None:
    text = str(torch.tensor([1.5, -2.0]).to(DEVICE))
    assert "1.5000" in text and "-2.0000" in text and "device='sim:0'" in text
