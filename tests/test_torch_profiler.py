"""PyTorch's profilers on a plugin device: real, ordered times, tables and traces.

``torch.autograd.profiler.profile(use_device=<name>)`` times each operator on
the device with a pair of plugin timing events (the shim's PrivateUse1
profiler stubs, cpp_shim/src/observe/profiler_stubs.cpp), as it does for CUDA with
CUDA events. ``torch.profiler.profile`` with ``ProfilerActivity.PrivateUse1``
records the operators' CPU side here; its device events (the kineto
activity profiler fed by the device trace) are tested in test_trace.py. A
plugin without timing events reports no device time rather than a made-up
one. torch-fl's own profiler, ``torch_fl.profile_layers``, is tested in
test_profile_layers.py.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from torch.autograd.profiler import profile as autograd_profile
from torch.profiler import ProfilerActivity, record_function

from .conftest import DEVICE, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def named(events, name: str):
    found = [e for e in events if e.name == name]
    assert found, f"no {name} in {sorted({e.name for e in events})}"
    return found


def assert_real(events) -> None:
    """CPU and device times are finite and non-negative, intervals ordered."""
    assert len(events) > 0
    for e in events:
        values = (e.time_range.start, e.time_range.end, e.cpu_time_total, e.device_time_total)
        assert all(math.isfinite(v) and v >= 0 for v in values), (e.name, values)
        assert e.time_range.end >= e.time_range.start, e.name


def operands(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two n x n matrices and a one-element tensor, with the profiled operators warmed up.

    An operator's first call on the device infers its output shapes on the
    host; a profile of that call would measure the inference.
    """
    a = torch.randn(n, n, device=DEVICE)
    b = torch.randn(n, n, device=DEVICE)
    one = torch.ones(1, device=DEVICE)
    (a @ b).relu().sum()
    one.add(1)
    torch.accelerator.synchronize()
    return a, b, one


def test_device_times_are_real_and_ordered() -> None:
    a, b, one = operands(384)
    start = time.perf_counter()
    with autograd_profile(use_device=DEVICE) as prof:
        for _ in range(3):
            (a @ b).relu()
            one.add(1)
    wall_us = (time.perf_counter() - start) * 1e6
    events = prof.function_events
    assert_real(events)
    mms, adds = named(events, "aten::mm"), named(events, "aten::add")
    # The big product takes device time; a one-element add takes less. The
    # fastest of each is compared: the host being descheduled during one
    # call (which a synchronous device measures) cannot flip the order.
    assert min(e.device_time_total for e in mms) > min(e.device_time_total for e in adds)
    # A child's device interval lies inside its parent's (both pairs of
    # events are on one in-order stream), and inside the profiled block.
    for matmul, mm in zip(named(events, "aten::matmul"), mms, strict=True):
        assert matmul.device_time_total >= mm.device_time_total > 0
        # CPU intervals nest the same way.
        assert matmul.time_range.start <= mm.time_range.start <= mm.time_range.end <= matmul.time_range.end
    assert max(e.device_time_total for e in events) <= wall_us


def test_key_averages_has_device_columns() -> None:
    a, b, one = operands(256)
    with autograd_profile(use_device=DEVICE, record_shapes=True) as prof:
        for _ in range(3):
            a @ b
            one + 1
    averages = prof.key_averages()
    mm = next(avg for avg in averages if avg.key == "aten::mm")
    assert mm.count == 3
    assert mm.device_time_total > 0
    assert math.isclose(mm.device_time, mm.device_time_total / 3)
    assert mm.self_device_time_total <= mm.device_time_total
    # PyTorch keeps calls that measured no device time (under a microsecond)
    # in a row of their own, as it does for CUDA.
    assert sum(avg.count for avg in averages if avg.key == "aten::add") == 3
    for avg in averages:
        assert avg.cpu_time_total >= 0 and avg.device_time_total >= 0, avg.key
    table = averages.table(sort_by="device_time_total", row_limit=10)
    assert "aten::mm" in table
    assert f"{DEVICE.upper()} total" in table, table.splitlines()[:3]
    by_shape = prof.key_averages(group_by_input_shape=True)
    assert any(avg.key == "aten::mm" and avg.input_shapes == [[256, 256], [256, 256]] for avg in by_shape)


def test_chrome_trace_export_parses(tmp_path: Path) -> None:
    a, b, _ = operands(128)
    with autograd_profile(use_device=DEVICE) as prof:
        a @ b
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    spans = {e["name"]: e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"}
    matmul, mm = spans["aten::matmul"], spans["aten::mm"]
    assert all(e["dur"] >= 0 for e in spans.values())
    assert matmul["ts"] <= mm["ts"] and mm["ts"] + mm["dur"] <= matmul["ts"] + matmul["dur"]


def test_backward_streams_and_ranges() -> None:
    side = torch.Stream(device=DEVICE)
    w = torch.randn(64, 64, device=DEVICE, requires_grad=True)
    x = torch.randn(32, 64, device=DEVICE)
    with autograd_profile(use_device=DEVICE) as prof:
        with record_function("forward"):
            loss = (x @ w).relu().sum()
        with record_function("backward"):
            loss.backward()
        # x was made on the default stream: order the side stream after it,
        # as on CUDA (strict mode poisons memory not yet written).
        side.wait_stream(torch.accelerator.current_stream())
        with side, record_function("side_stream"):
            y = x * 2
        side.synchronize()
    events = prof.function_events
    assert_real(events)
    names = {e.name for e in events}
    assert {"forward", "backward", "side_stream"} <= names
    assert any("Backward" in n for n in names), names
    # A range's device interval encloses those of the operators it ran
    # (the backward pass has products of its own, which it need not enclose).
    (forward,) = named(events, "forward")
    inner = [
        e for e in named(events, "aten::mm") if forward.time_range.start <= e.time_range.start <= forward.time_range.end
    ]
    assert inner and forward.device_time_total >= max(e.device_time_total for e in inner)
    torch.testing.assert_close(y.cpu(), x.cpu() * 2)


def test_torch_profiler_with_the_privateuse1_activity(tmp_path: Path) -> None:
    a, b, _ = operands(128)
    activities = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        with record_function("step"):
            (a @ b).sum().item()
    events = prof.events()
    assert_real(events)
    (step,) = named(events, "step")
    (mm,) = named(events, "aten::mm")
    assert step.time_range.start <= mm.time_range.start <= mm.time_range.end <= step.time_range.end
    assert "aten::mm" in prof.key_averages().table(row_limit=5)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    assert any(e.get("name") == "aten::mm" for e in json.loads(path.read_text())["traceEvents"])


@pytest.mark.mode_independent  # the fixture plugin, not the simulator
@pytest.mark.parametrize(
    ("variant", "defines", "timed"),
    [
        ("timed", [], True),
        # No TFL_CAP_EVENT_TIMING, no event_elapsed_time.
        ("no_event_timing", ["FIXTURE_NO_EVENT_TIMING"], False),
        # Declares the capability but lacks the optional entry.
        ("null_optional", ["FIXTURE_NULL_OPTIONAL"], False),
    ],
)
def test_device_times_without_timing_events_are_zero_not_garbage(fixture_plugin, variant, defines, timed) -> None:
    path = fixture_plugin(variant, *defines)
    run = run_python(
        f"""
            import json, math, warnings
            import torch, torch_fl
            from torch.autograd.profiler import profile
            torch_fl.register_device_plugin(name="fxdev", plugin_path={str(path)!r})
            a = torch.ones(64, device="fxdev")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with profile(use_device="fxdev") as prof:
                    b = (a + a).relu()
                rows = [(e.name, e.cpu_time_total, e.device_time_total) for e in prof.function_events]
                prof.key_averages().table()
            assert b.cpu().eq(2).all()
            print(json.dumps({{"rows": rows, "warnings": [str(w.message) for w in caught]}}))
            """
    )
    result = json.loads(assert_ok(run).splitlines()[-1])
    assert "RecordFunction callback" not in run.stderr, run.stderr
    names = {name for name, _, _ in result["rows"]}
    assert {"aten::add", "aten::relu"} <= names, names
    for name, cpu, dev in result["rows"]:
        assert math.isfinite(cpu) and cpu >= 0, (name, cpu)
        assert math.isfinite(dev) and dev >= 0, (name, dev)
        if not timed:
            assert dev == 0, (name, dev)
    assert not [w for w in result["warnings"] if "torch-fl" in w], result["warnings"]
