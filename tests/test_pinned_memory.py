"""Pinned host memory for tensor.pin_memory() and DataLoader(pin_memory=True)."""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICE, assert_close

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def test_pin_memory() -> None:
    x = torch.randn(64)
    p = x.pin_memory()
    assert p.is_pinned() and not x.is_pinned()
    assert p[10:].is_pinned(), "slices of pinned memory are pinned"
    assert_close(p.to(DEVICE, non_blocking=True), x)


def test_dataloader_pins_batches() -> None:
    data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.arange(8))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    for inputs, labels in loader:
        assert inputs.is_pinned() and labels.is_pinned()
        assert inputs.to(DEVICE, non_blocking=True).device.type == DEVICE
