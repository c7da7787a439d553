"""The debugger's view: the plugin's own activity records (ABI 1.8) in the device trace.

The simulator reports what each call made it do: its queue submissions (its
native calls, on the host clock), its kernels, copies and fills on its own
device clock, host waits, and user ranges. ``torch_fl.trace`` nests them
under the call that caused them, maps device times onto the host timeline
through the plugin's clock pairs, draws them on per-stream device tracks in
the Chrome/Perfetto file, and ``torch.profiler`` shows the plugin's kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

import torch_fl

from .conftest import DEVICE

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

nvtx = getattr(torch, DEVICE).nvtx


def warm() -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(64, 64, device=DEVICE)
    b = torch.randn(64, 64, device=DEVICE)
    (a @ b).relu()
    torch.add(a, b)
    torch.accelerator.synchronize()
    return a, b


def the(trace: torch_fl.DeviceTrace, name: str) -> torch_fl.TraceEvent:
    found = [e for e in trace.events if e.name == name]
    assert len(found) == 1, f"{name}: {[e.name for e in trace.events]}"
    return found[0]


def test_the_simulator_reports_records() -> None:
    assert torch_fl._C.activity_status() == (True, True)


def test_each_call_carries_its_native_calls_and_device_work() -> None:
    a, b = warm()
    with torch_fl.trace() as t:
        c = a @ b
    mm = the(t, "mm")
    assert mm.call > 0
    kinds = {r.kind for r in mm.native}
    assert {"api", "kernel"} <= kinds, mm.native
    assert all(r.call == mm.call for r in mm.native)
    api = next(r for r in mm.native if r.kind == "api")
    assert api.host_clock and api.name and api.device == 0
    # A native call of the call happens during it, on the host clock.
    assert mm.host_begin_ns <= api.begin_ns <= api.end_ns <= mm.host_end_ns
    work = [r for r in mm.native if r.device_work]
    assert work and all(not r.host_clock and r.stream == 0 for r in work)
    # The call's device time is the span of its device records, which the
    # plugin's clock pairs put after the call began.
    assert mm.device_begin_ns == min(r.begin_ns for r in work)
    assert mm.device_end_ns == max(r.end_ns for r in work)
    assert mm.device_begin_ns >= mm.host_begin_ns
    torch.testing.assert_close(c.cpu(), a.cpu() @ b.cpu(), rtol=1e-4, atol=1e-4)


def test_copies_and_fills_are_device_work_with_their_size() -> None:
    warm()
    host = torch.randn(1024)
    with torch_fl.trace() as t:
        x = host.to(DEVICE)
        x.zero_()
        x.cpu()
    copies = [r for e in t.events for r in e.native if r.kind == "copy"]
    assert copies and any("4096" in r.detail for r in copies), copies
    fills = [r for e in t.events for r in e.native if r.kind in ("memset", "kernel") and e.name.startswith("zero_")]
    assert fills, [(e.name, e.native) for e in t.events]


def test_work_on_a_side_stream_is_on_that_stream() -> None:
    a, b = warm()
    side = torch.Stream(device=DEVICE)
    with torch_fl.trace() as t:
        with side:
            a @ b
        side.synchronize()
    mm = the(t, "mm")
    assert mm.stream == 1
    assert all(r.stream == 1 for r in mm.native if r.device_work)


def test_synchronize_is_recorded_as_a_wait() -> None:
    a, b = warm()
    with torch_fl.trace() as t:
        a @ b
        torch.accelerator.synchronize()
    assert any(r.kind == "sync" for r in t.native), t.native


def test_ranges_reach_the_plugin_and_come_back_as_records() -> None:
    a, b = warm()
    with torch_fl.trace() as t:
        assert nvtx.range_push("outer") == 0
        with nvtx.range("inner {}", 1):
            a @ b
        assert nvtx.range_pop() == 0
        nvtx.mark("done")
        with record_function("user_block"):
            torch.add(a, b)
    assert nvtx.range_pop() == -1
    ranges = {r.name: r for r in t.native if r.kind == "range"}
    assert {"outer", "inner 1", "user_block"} <= set(ranges), ranges
    assert ranges["outer"].begin_ns <= ranges["inner 1"].begin_ns <= ranges["inner 1"].end_ns <= ranges["outer"].end_ns
    marks = [r for r in t.native if r.kind == "mark"]
    assert [m.name for m in marks] == ["done"] and marks[0].begin_ns == marks[0].end_ns


def test_recording_stops_with_the_last_trace() -> None:
    a, b = warm()
    with torch_fl.trace() as t:
        a @ b
    assert t.native
    a @ b  # not traced: the plugin records nothing
    torch.accelerator.synchronize()
    with torch_fl.trace() as later:
        pass
    assert [r for r in later.native if r.kind == "kernel"] == []


def test_the_chrome_trace_nests_native_calls_and_draws_device_tracks(tmp_path: Path) -> None:
    a, b = warm()
    target = tmp_path / "trace.json"
    with torch_fl.trace(target) as t:
        (a @ b).relu()
    events = json.loads(target.read_text())["traceEvents"]
    mm = the(t, "mm")
    host_api = [e for e in events if e["ph"] == "X" and e["pid"] == 0 and e["cat"] == "native:api"]
    assert any(e["tid"] == mm.thread and e["args"]["operator"] == "mm" for e in host_api), host_api
    device_work = [e for e in events if e["ph"] == "X" and e["pid"] >= 1000 and e["cat"] == "native:kernel"]
    assert {e["args"]["operator"] for e in device_work} >= {"mm", "relu"}
    rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name" and e["pid"] >= 1000}
    assert "stream 0 (default)" in rows
    assert len([e for e in events if e["ph"] == "s"]) == len([e for e in events if e["ph"] == "f"]) >= 2


def test_the_native_report_lists_each_operators_native_calls() -> None:
    a, b = warm()
    with torch_fl.trace() as t:
        for _ in range(3):
            a @ b
    report = t.native_report()
    assert "mm (kernel): 3 calls" in report, report
    mm = the_first(t, "mm")
    for r in mm.native:
        assert f" {r.name} " in report
    assert f"{len(t.events)} calls, {len(t.native)} plugin records" in report


def the_first(trace: torch_fl.DeviceTrace, name: str) -> torch_fl.TraceEvent:
    return next(e for e in trace.events if e.name == name)


def test_torch_profiler_shows_the_plugins_own_kernels() -> None:
    a, b = warm()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        (a @ b).relu()
        torch.accelerator.synchronize()
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert device, [e.name for e in prof.events()]
    mm_cpu = next(e for e in prof.key_averages() if e.key == "aten::mm")
    assert mm_cpu.self_device_time_total > 0 or mm_cpu.device_time_total > 0


def test_python_m_torch_fl_trace_runs_a_script_and_prints_native_calls(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import torch, torch_fl
            torch_fl.register_device_plugin(name="{DEVICE}")
            a = torch.randn(32, 32, device="{DEVICE}")
            print("sum", (a @ a).relu().sum().item() != 0)
            """
        )
    )
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "torch_fl", "trace", "--out", str(out), "--", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "sum True" in result.stdout
    assert "mm (kernel): 1 call," in result.stdout, result.stdout
    assert " kernel " in result.stdout and " api " in result.stdout
    traces = list(out.glob("trace-*.json"))
    assert len(traces) == 1 and str(traces[0]) in result.stdout
    json.loads(traces[0].read_text())


def test_python_m_torch_fl_trace_returns_the_commands_exit_code(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch_fl",
            "trace",
            "--out",
            str(tmp_path),
            "--",
            sys.executable,
            "-c",
            "raise SystemExit(5)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 5
    assert "traced nothing" in result.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "torch_fl", "trace"], capture_output=True, text=True, timeout=120, check=False
    )
    assert usage.returncode == 2 and "nothing to run" in usage.stderr
