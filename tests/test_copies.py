"""Copies between the host and the device, and between the two devices."""

from __future__ import annotations

import pytest
import torch

import torch_fl

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


# --- ordering without host synchronization -------------------------------
#
# Whether the host blocked is read from torch-fl's own counter of the waits
# it makes (torch_fl._C.sync_counts), never from timing.


def copy_waits() -> int:
    return torch_fl._C.sync_counts()["copy_waits"]


def test_cross_device_copy_does_not_block_the_host() -> None:
    src = torch.arange(1 << 16, dtype=torch.float32, device="sim:0") * 2  # queued on sim:0
    torch_fl._C.reset_sync_counts()
    for non_blocking in (False, True):  # as on CUDA, neither waits for a device-to-device copy
        dst = src.to("sim:1", non_blocking=non_blocking)
        also = torch.empty(1 << 16, device="sim:1")
        also.copy_(src, non_blocking=non_blocking)
    assert copy_waits() == 0
    assert_close(dst, torch.arange(1 << 16, dtype=torch.float32) * 2)  # this one waits
    assert_close(also, torch.arange(1 << 16, dtype=torch.float32) * 2)
    assert copy_waits() == 2


def test_cross_device_copy_is_ordered_with_both_devices_streams() -> None:
    n = 1 << 18
    src = torch.ones(n, device="sim:0")
    for _ in range(5):
        src = src + 1  # the copy must read the last of these
    dst = torch.zeros(n, device="sim:1")
    read_before = dst * 1  # queued on sim:1: the copy must not overwrite dst under it
    dst.copy_(src)
    after = dst + 1  # queued on sim:1 after the copy: must see the copied values
    assert_close(read_before, torch.zeros(n))
    assert_close(after, torch.full((n,), 7.0))
    back = torch.empty(n, device="sim:0")
    back.copy_(after)  # and the way back
    assert_close(back - 1, torch.full((n,), 6.0))


def test_cross_device_copy_uses_the_current_streams() -> None:
    n = 1 << 16
    side0 = torch.Stream(device="sim:0")
    side1 = torch.Stream(device="sim:1")
    src = torch.arange(n, dtype=torch.float32, device="sim:0")
    side0.wait_stream(torch.sim.current_stream(0))
    with torch.sim.stream(side0), torch.sim.stream(side1):
        dst = src.to("sim:1")  # runs on side0, ordered before side1's later work
        out = dst * 3
    torch.sim.current_stream(1).wait_stream(side1)
    assert_close(out, torch.arange(n, dtype=torch.float32) * 3)


def test_converting_broadcasting_and_strided_copies_across_devices() -> None:
    x = torch.arange(12.0).reshape(3, 4)
    torch_fl._C.reset_sync_counts()
    wide = torch.empty(4, 3, dtype=torch.float64, device="sim:1")
    wide.copy_(x.to("sim:0").t())  # strided source, converting
    row = torch.empty(2, 4, dtype=torch.int32, device="sim:1")
    row.copy_(x[1].to("sim:0"))  # broadcast
    strided = torch.zeros(4, 6, device="sim:1")[:, ::2]
    strided.copy_(x.to("sim:0").t())  # strided destination
    assert copy_waits() == 0, "the conversions ran on the devices"
    assert_close(wide, x.t().double())
    assert_close(row, x[1].to(torch.int32).expand(2, 4))
    assert_close(strided, x.t())


def test_copies_to_and_from_the_host_wait_only_when_they_must() -> None:
    x = torch.arange(4096.0)
    pinned = x.pin_memory()
    torch_fl._C.reset_sync_counts()
    on_device = pinned.to(DEVICE, non_blocking=True)  # queued, pinned source kept alive
    from_pageable = x.to(DEVICE)  # staged: the caller's memory is free on return
    assert copy_waits() == 0
    out = torch.empty(4096, pin_memory=True)
    out.copy_(on_device + from_pageable, non_blocking=True)  # into pinned memory: queued
    assert copy_waits() == 0
    torch.sim.current_stream().synchronize()
    torch.testing.assert_close(out, x * 2)
    torch.testing.assert_close(on_device.cpu(), x)  # into pageable memory: waits for the stream
    assert copy_waits() == 1


def test_record_stream_keeps_memory_until_the_side_stream_used_it() -> None:
    n = 1 << 18
    side = torch.Stream(device=DEVICE)
    for _ in range(3):
        x = torch.arange(n, dtype=torch.float32, device=DEVICE)
        side.wait_stream(torch.sim.current_stream())
        with torch.sim.stream(side):
            y = x * 2  # reads x on the side stream
        x.record_stream(side)
        del x  # freed on the default stream while the side stream may still read it
        z = torch.full((n,), -1.0, device=DEVICE)  # may reuse x's memory, not before y is done
        torch.sim.current_stream().wait_stream(side)
        assert_close(y, torch.arange(n, dtype=torch.float32) * 2)
        assert_close(z, torch.full((n,), -1.0))


def test_record_stream_checks_the_stream() -> None:
    x = torch.ones(4, device="sim:0")
    with pytest.raises(RuntimeError, match=r"record_stream: the tensor is on sim:0 but the stream is on sim:1"):
        x.record_stream(torch.Stream(device="sim:1"))
    with pytest.raises(RuntimeError, match=r"record_stream: expected a sim stream"):
        x.record_stream(torch.Stream(device="cpu"))
