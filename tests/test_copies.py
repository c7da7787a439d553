"""Copies between the host and the device, and between the two devices."""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICE, assert_close

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_keeps_values(dtype: torch.dtype) -> None:
    x = (torch.arange(24).reshape(2, 3, 4) % 5).to(dtype)
    y = x.to(DEVICE)
    assert y.dtype == dtype and y.device == torch.device("sim:0")
    torch.testing.assert_close(y.cpu(), x)


def test_strided_sources_and_destinations() -> None:
    x = torch.arange(30.0).reshape(5, 6)
    assert_close(x.t().to(DEVICE), x.t().contiguous())
    assert_close(x[::2, 1::3].to(DEVICE), x[::2, 1::3])
    d = torch.zeros(6, 5, device=DEVICE)
    d.t().copy_(x)  # a strided device destination
    assert_close(d.t(), x)
    torch.testing.assert_close(d[1:4].to("cpu"), x.t()[1:4])


def test_device_to_device_between_the_two_devices() -> None:
    x = torch.randn(4, 5)
    on0 = x.to("sim:0")
    on1 = on0.to("sim:1")
    assert on1.device == torch.device("sim:1")
    assert_close(on1, x)
    back = on1.t().to("sim:0")  # strided, across devices
    assert_close(back, x.t())


def test_dtype_converting_copies() -> None:
    x = torch.tensor([1.7, -2.2, 3.9])
    assert_close(x.to(DEVICE, torch.int32), x.to(torch.int32))
    d = torch.empty(3, dtype=torch.float64, device=DEVICE)
    d.copy_(x.to(DEVICE))
    assert_close(d, x.double())


@pytest.mark.parametrize("pinned", [False, True])
def test_non_blocking_copies_are_correct_after_synchronize(pinned: bool) -> None:
    x = torch.arange(1000.0)
    if pinned:
        x = x.pin_memory()
    y = x.to(DEVICE, non_blocking=True)
    z = torch.empty(1000, pin_memory=pinned)
    z.copy_(y * 2, non_blocking=True)
    torch.sim.synchronize()
    torch.testing.assert_close(z, x * 2)


def test_blocking_copy_to_host_waits_for_queued_work() -> None:
    x = torch.ones(1 << 16, device=DEVICE)
    for _ in range(20):
        x = x + 1  # queued on the device's stream
    assert x.cpu()[-1].item() == 21.0


def test_item_and_python_scalars() -> None:
    x = torch.tensor([3.5, 4.0]).to(DEVICE)
    assert x[0].item() == 3.5
    assert (x.sum()).item() == 7.5
    assert bool(x[1] > 3) is True
    assert int(torch.tensor(7).to(DEVICE)) == 7
