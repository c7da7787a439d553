"""The device trace: torch_fl.trace(), TORCH_FL_TRACE, and torch.profiler's PrivateUse1 device events.

Every call torch-fl makes into the plugin for an operator (kernels, copies)
and every CPU fallback is recorded with its plugin, kernel symbol, device,
stream, argument shapes, host time and - the simulator times events -
device time from a pair of plugin timing events.
"""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import torch_fl

from .conftest import DEVICE, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def warm(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Two device matrices, with mm/relu/sum run once (their first call infers output shapes)."""
    a = torch.randn(n, n, device=DEVICE)
    b = torch.randn(n, n, device=DEVICE)
    (a @ b).relu().sum()
    torch.accelerator.synchronize()
    return a, b


def named(trace: torch_fl.DeviceTrace, name: str) -> list[torch_fl.TraceEvent]:
    found = [e for e in trace.events if e.name == name]
    assert found, f"no {name} in {sorted({e.name for e in trace.events})}"
    return found


def test_kernels_are_recorded_with_plugin_symbol_shapes_and_times() -> None:
    a, b = warm()
    with torch_fl.trace() as t:
        c = (a @ b).relu()
    mm = named(t, "mm")
    assert len(mm) == 1
    e = mm[0]
    assert e.kind == "kernel"
    assert "sim" in e.plugin
    assert e.kernel_symbol == "torch_fl_op_mm"
    assert e.inputs == "f32[32, 32], f32[32, 32]"
    assert (e.device, e.stream, e.thread) == (0, 0, e.thread)
    assert e.host_end_ns >= e.host_begin_ns > 0
    # The simulator times events: the work has a device time, and never
    # starts before the call that queued it.
    assert e.device_begin_ns is not None and e.device_end_ns is not None
    assert e.device_end_ns >= e.device_begin_ns >= e.host_begin_ns
    assert e.device_us is not None and e.device_us >= 0
    relu = named(t, "relu")[0]
    assert relu.inputs == "f32[32, 32]"
    # One stream runs its work in order.
    assert relu.device_begin_ns is not None and relu.device_begin_ns >= e.device_end_ns
    torch.testing.assert_close(c.cpu(), (a.cpu() @ b.cpu()).relu(), rtol=1e-4, atol=1e-4)


def test_scalars_and_lists_are_described() -> None:
    x = torch.ones(2, 3, device=DEVICE)
    x.add(x, alpha=2)
    x.sum(dim=[1])
    torch.accelerator.synchronize()
    with torch_fl.trace() as t:
        x.add(x, alpha=2)
        x.sum(dim=[1])
    assert named(t, "add.Tensor")[0].inputs == "f32[2, 3], f32[2, 3], 2"
    assert named(t, "sum.dim_IntList")[0].inputs.startswith("f32[2, 3], [1], False")


def test_copies_are_recorded_with_direction_and_size() -> None:
    host = torch.arange(1000, dtype=torch.float32)
    with torch_fl.trace() as t:
        dev = host.to(DEVICE)
        back = dev.cpu()
    up = named(t, "copy (host to device)")
    down = named(t, "copy (device to host)")
    assert [e.bytes for e in up] == [4000]
    assert [e.bytes for e in down] == [4000]
    assert all(e.kind == "copy" and e.device == 0 for e in up + down)
    torch.testing.assert_close(back, host)


def test_cpu_fallbacks_are_recorded() -> None:
    x = torch.linspace(-1, 1, 8, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_fl.trace() as t:
            y = torch.special.i0e(x)
    # The functional form is composite: the out= overload falls back.
    fallback = named(t, "aten::special_i0e.out")
    assert fallback[0].kind == "fallback"
    assert fallback[0].plugin == ""
    assert fallback[0].inputs.startswith("f32[8], f32[")
    assert fallback[0].device == 0
    torch.testing.assert_close(y.cpu(), torch.special.i0e(x.cpu()))


def test_a_side_stream_gets_its_own_row() -> None:
    a, b = warm()
    side = torch.Stream(device=DEVICE)
    with torch_fl.trace() as t:
        a @ b
        with side:
            a @ b
        torch.accelerator.synchronize()
    streams = [e.stream for e in named(t, "mm")]
    assert streams == [0, 1]


def test_calls_from_another_thread_are_attributed_to_it() -> None:
    a, b = warm()

    def work() -> None:
        torch.accelerator.set_device_index(0)
        a @ b

    with torch_fl.trace() as t:
        a @ b
        worker = threading.Thread(target=work)
        worker.start()
        worker.join(timeout=60)
        assert not worker.is_alive()
    threads = {e.thread for e in named(t, "mm")}
    assert len(threads) == 2


def test_traces_nest_and_recording_stops_after_the_last() -> None:
    a, b = warm()
    with torch_fl.trace() as outer:
        a @ b
        with torch_fl.trace() as inner:
            a.relu()
        a.sum()
    assert [e.name for e in inner.events] == ["relu"]
    assert [e.name for e in outer.events if e.kind == "kernel"] == ["mm", "relu", "sum"]
    a @ b  # not traced: nothing is open
    with torch_fl.trace() as later:
        pass
    assert later.events == []


def test_chrome_trace_has_host_and_device_rows_linked_by_flows(tmp_path: Path) -> None:
    a, b = warm()
    target = tmp_path / "sub" / "trace.json"
    with torch_fl.trace(target) as t:
        (a @ b).relu()
    doc = json.loads(target.read_text())
    events = doc["traceEvents"]
    names = {(e["pid"], e["name"]) for e in events if e["ph"] == "X"}
    device_pid = next(
        e["pid"] for e in events if e.get("name") == "process_name" and e["args"]["name"] == f"{DEVICE}:0"
    )
    assert (0, "mm") in names and (device_pid, "mm") in names
    mm_host = next(e for e in events if e["ph"] == "X" and e["pid"] == 0 and e["name"] == "mm")
    assert mm_host["args"]["kernel_symbol"] == "torch_fl_op_mm"
    assert mm_host["args"]["inputs"] == "f32[32, 32], f32[32, 32]"
    starts = [e for e in events if e["ph"] == "s"]
    finishes = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(finishes) == len([e for e in t.events if e.device_begin_ns is not None])
    assert doc["otherData"]["torch_fl_device"] == DEVICE
    assert "mm" in t.summary()


def test_torch_fl_trace_environment_variable_writes_the_trace_at_exit(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import torch, torch_fl
        torch_fl.register_device_plugin(name="{DEVICE}")
        a = torch.randn(16, 16, device="{DEVICE}")
        print((a @ a).sum().item() != 0)
        """,
        env={"TORCH_FL_TRACE": str(tmp_path / "run-{pid}.json")},
        timeout=240,
    )
    assert_ok(result)
    files = list(tmp_path.glob("run-*.json"))
    assert len(files) == 1, files
    assert "wrote the device trace" in result.stderr
    doc = json.loads(files[0].read_text())
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert {"mm", "sum", "copy (device to host)"} <= names


def test_torch_profiler_shows_device_kernels_linked_to_their_operators(tmp_path: Path) -> None:
    a, b = warm(64)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        (a @ b).relu().sum()
        torch.accelerator.synchronize()
    kernels = {e.name for e in prof.events() if _is_device(e)}
    assert {"mm", "relu", "sum"} <= kernels, kernels
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::mm"].device_time_total > 0
    trace_file = tmp_path / "profile.json"
    prof.export_chrome_trace(str(trace_file))
    exported = json.loads(trace_file.read_text())
    kernel_rows = [e for e in exported["traceEvents"] if e.get("cat") == "kernel" and e.get("name") == "mm"]
    assert kernel_rows, "no device kernel in the exported trace"


def _is_device(event) -> bool:
    """PyTorch reports the plugin's events with PrivateUse1 as their device type (printed as DeviceType.SIM)."""
    return event.device_type == DeviceType.PrivateUse1


def test_a_cpu_only_profile_gets_no_device_events() -> None:
    a, b = warm()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        a @ b
        torch.accelerator.synchronize()
    assert not [e for e in prof.events() if _is_device(e)]


@pytest.mark.mode_independent  # the fixture plugin, not the simulator
@pytest.mark.parametrize(
    ("variant", "defines"),
    [("no_event_timing", ["FIXTURE_NO_EVENT_TIMING"]), ("null_optional", ["FIXTURE_NULL_OPTIONAL"])],
)
def test_a_plugin_without_timing_events_is_traced_without_device_times(fixture_plugin, variant, defines) -> None:
    path = fixture_plugin(variant, *defines)
    run = run_python(
        f"""
        import json, warnings
        import torch, torch_fl
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
        warnings.simplefilter("ignore")
        torch_fl.register_device_plugin(name="fxdev", plugin_path={str(path)!r})
        a = torch.ones(64, device="fxdev")
        (a + a).relu()
        with torch_fl.trace() as t:
            b = (a + a).relu()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            (a + a).relu()
        assert b.cpu().eq(2).all()
        device = [e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
        rows = [(e.kind, e.name, e.device_us) for e in t.events]
        print(json.dumps({{"rows": rows, "device": device}}))
        """,
        timeout=240,
    )
    result = json.loads(assert_ok(run).splitlines()[-1])
    kernels = [(name, device_us) for kind, name, device_us in result["rows"] if kind == "kernel"]
    assert [name for name, _ in kernels] == ["add.Tensor", "relu"]
    assert all(device_us is None for _, device_us in kernels)
    assert result["device"] == []


def test_a_forked_child_does_not_write_its_parents_trace(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import os, sys
        import torch, torch_fl
        torch_fl.register_device_plugin(name="{DEVICE}")
        a = torch.randn(8, 8, device="{DEVICE}")
        (a @ a).sum().item()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a normal exit: atexit handlers run in the child too
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        """,
        env={"TORCH_FL_TRACE": str(tmp_path / "run-{pid}.json")},
        timeout=240,
    )
    assert "child exit 0" in assert_ok(result)
    files = list(tmp_path.glob("run-*.json"))
    assert len(files) == 1, files
    names = {e["name"] for e in json.loads(files[0].read_text())["traceEvents"] if e["ph"] == "X"}
    assert "mm" in names
