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
