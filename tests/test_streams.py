"""Streams and events through torch.<name>, torch.Stream/Event and torch.accelerator."""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICE, assert_close

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def test_current_and_default_streams() -> None:
    s = torch.sim.current_stream()
    assert s.device == torch.device("sim:0")
    assert torch.accelerator.current_stream().device_type == s.device_type


def test_work_on_a_created_stream() -> None:
    s = torch.sim.Stream()
    x = torch.ones(1 << 16, device=DEVICE)
    # As on CUDA, work on another stream must wait for the producer's stream.
    s.wait_stream(torch.sim.current_stream())
    with torch.sim.stream(s):
        assert torch.sim.current_stream() == s
        y = x * 3
    assert torch.sim.current_stream() != s
    s.synchronize()
    assert s.query()
    assert_close(y[:4], torch.full((4,), 3.0))


def test_events_order_streams_and_time_work() -> None:
    s1, s2 = torch.sim.Stream(), torch.sim.Stream()
    start, end = torch.sim.Event(enable_timing=True), torch.sim.Event(enable_timing=True)
    x = torch.ones(1 << 18, device=DEVICE)
    s1.wait_stream(torch.sim.current_stream())
    with torch.sim.stream(s1):
        start.record()
        y = x + 1
        end.record()
    s2.wait_event(end)
    with torch.sim.stream(s2):
        z = y * 2
    s2.synchronize()
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) >= 0.0
    assert z[0].item() == 4.0


def test_torch_stream_and_event_with_the_device_string() -> None:
    s = torch.Stream(device=DEVICE)
    e = torch.Event(device=DEVICE)
    e.record(s)
    e.synchronize()
    assert e.query()


def test_accelerator_api() -> None:
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 2
    prev = torch.accelerator.current_device_index()
    torch.accelerator.set_device_index(1)
    try:
        assert torch.sim.current_device() == 1
        assert torch.ones(1, device=DEVICE).device == torch.device("sim:1")
    finally:
        torch.accelerator.set_device_index(prev)
    with torch.sim.device(1):
        assert torch.accelerator.current_device_index() == 1
    assert torch.accelerator.current_device_index() == prev
    torch.accelerator.synchronize()
    torch.sim.synchronize(1)


def test_default_stream_is_the_current_one_until_another_is_set() -> None:
    default = torch.sim.default_stream()
    assert default.stream_id == 0 and default.device == torch.device("sim:0")
    assert torch.sim.current_stream() == default
    assert torch.sim.default_stream(1).device == torch.device("sim:1")
    s = torch.sim.Stream()
    assert s != default
    torch.sim.set_stream(s)
    try:
        assert torch.sim.current_stream() == s
        assert torch.sim.default_stream() == default
    finally:
        torch.sim.set_stream(default)
    assert torch.sim.current_stream() == default
    torch.sim.set_stream(None)  # a no-op, as on CUDA
    assert torch.sim.current_stream() == default


def test_work_on_the_default_stream_is_ordered_with_the_current_one() -> None:
    x = torch.ones(1 << 16, device=DEVICE)
    torch.sim.default_stream().synchronize()
    assert torch.sim.default_stream().query()
    assert_close(x[:2] * 2, torch.full((2,), 2.0))


def test_stream_context_on_another_device_restores_both_devices() -> None:
    s1 = torch.sim.Stream("sim:1")
    prev0, prev1 = torch.sim.current_stream(0), torch.sim.current_stream(1)
    ctx = torch.sim.stream(s1)
    assert isinstance(ctx, torch.sim.StreamContext)
    with ctx:
        # As on CUDA, the stream's device is current inside.
        assert torch.sim.current_device() == 1
        assert torch.sim.current_stream() == s1
        y = torch.ones(4, device="sim") + 1
    assert torch.sim.current_device() == 0
    assert torch.sim.current_stream(0) == prev0 and torch.sim.current_stream(1) == prev1
    s1.synchronize()
    assert y.device == torch.device("sim:1")
    assert_close(y, torch.full((4,), 2.0))
    with torch.sim.stream(None):
        assert torch.sim.current_stream() == prev0


def test_record_event_and_wait_event() -> None:
    s1, s2 = torch.sim.Stream(), torch.sim.Stream()
    x = torch.ones(1 << 16, device=DEVICE)
    s1.wait_stream(torch.sim.current_stream())
    with torch.sim.stream(s1):
        y = x * 5
    e = s1.record_event()
    assert isinstance(e, torch.Event) and e.device == torch.device("sim:0")
    s2.wait_event(e)
    with torch.sim.stream(s2):
        z = y + 1
    s2.synchronize()
    assert e.query()
    assert_close(z[:2], torch.full((2,), 6.0))


def test_event_timing_must_be_enabled() -> None:
    a, b = torch.sim.Event(), torch.sim.Event()
    assert a.query(), "an event never recorded counts as complete"
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)


def test_elapsed_time_is_ordered() -> None:
    start, middle, end = (torch.sim.Event(enable_timing=True) for _ in range(3))
    x = torch.ones(1 << 18, device=DEVICE)
    start.record()
    for _ in range(4):
        x = x * 1.0001
    middle.record()
    x = x + 1
    end.record()
    end.synchronize()
    first, total = start.elapsed_time(middle), start.elapsed_time(end)
    assert 0.0 <= first <= total
    assert middle.elapsed_time(end) >= 0.0
