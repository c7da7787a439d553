"""Tensors on different devices are refused with PyTorch's wording."""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICE, assert_close

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def test_device_and_cpu_tensor() -> None:
    message = r"Expected all tensors to be on the same device, but found at least two devices, sim:0 and cpu!"
    with pytest.raises(RuntimeError, match=message):
        torch.ones(3, device=DEVICE) + torch.ones(3)


def test_two_devices_of_the_plugin() -> None:
    with pytest.raises(RuntimeError, match=r"found at least two devices, sim:0 and sim:1"):
        torch.ones(3, device="sim:0") * torch.ones(3, device="sim:1")


def test_non_elementwise_ops_check_too() -> None:
    with pytest.raises(RuntimeError, match="found at least two devices"):
        torch.mm(torch.ones(2, 2, device=DEVICE), torch.ones(2, 2))


def test_zero_dim_cpu_tensors_are_allowed_as_scalars() -> None:
    x = torch.arange(4.0).to(DEVICE)
    assert_close(x * torch.tensor(2.0), torch.arange(4.0) * 2)
    assert_close(torch.tensor(1.5) + x, torch.arange(4.0) + 1.5)
