"""torch.save / torch.load of device tensors."""

from __future__ import annotations

import io

import pytest
import torch

from .conftest import DEVICE, assert_close

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_device_tensors_come_back_on_the_device() -> None:
    x = torch.randn(3, 4)
    y = round_trip(x.to("sim:1"))
    assert y.device == torch.device("sim:1")
    assert_close(y, x)


def test_map_location() -> None:
    x = torch.randn(5)
    assert round_trip(x.to(DEVICE), map_location="cpu").device.type == "cpu"
    assert round_trip(x, map_location=DEVICE).device == torch.device("sim:0")


def test_views_keep_sharing_storage() -> None:
    base = torch.arange(10.0).to(DEVICE)
    a, b = round_trip((base, base[2:5]))
    b.fill_(-1)
    assert a[3].item() == -1.0


def test_state_dicts() -> None:
    model = torch.nn.Linear(4, 2).to(DEVICE)
    loaded = round_trip(model.state_dict())
    assert loaded["weight"].device.type == DEVICE
    assert_close(loaded["weight"], model.weight.detach().cpu())
