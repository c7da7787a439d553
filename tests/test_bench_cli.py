"""``python -m torch_fl bench``: the shape of its report, never its figures."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import warnings
from glob import glob
from pathlib import Path

import pytest
import torch

from .conftest import DEVICE

# The report's shape is what these check; it cannot depend on the
# simulator's mode, so one run (the default mode) covers them.
pytestmark = [pytest.mark.runtime, pytest.mark.mode_independent]

WORKLOADS = {"resnet18", "gpt", "lstm"}
MODES = {"train", "infer"}


def _bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch_fl", "bench", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.timeout(300)
def test_quick_run_reports_every_workload_mode_and_device(tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    result = _bench("--quick", "--devices", "sim,cpu", "--threads", "1", "--json", "--html", str(page))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["devices"] == ["sim", "cpu"]
    assert report["baseline"] == "cpu"
    # One torch-fl device: measured in this process, no child.
    assert report["device_info"] == {"sim": {"process": "this", "plugin": "sim 0.1.0"}, "cpu": {"process": "this"}}
    assert report["torch"] and report["torch_fl"] and report["machine"]["cpu_count"]
    assert report["machine"]["torch_threads"] == 1
    rows = {(r["workload"], r["mode"]): r for r in report["results"]}
    assert set(rows) == {(w, m) for w in WORKLOADS for m in MODES}
    for (workload, mode), row in rows.items():
        assert row["unit"] == ("tokens/s" if workload == "gpt" else "samples/s")
        assert set(row["devices"]) == {"sim", "cpu"}
        for device, entry in row["devices"].items():
            if "skipped" in entry:
                assert workload == "resnet18" and "torchvision" in entry["skipped"]
                assert row["ratios"][device] is None
                continue
            assert "error" not in entry, (workload, mode, device, entry)
            tp = entry["throughput"]
            assert math.isfinite(tp) and tp > 0, entry
            assert entry["steps"] == 3 and entry["median_step_ms"] > 0
            assert tp == pytest.approx(entry["items_per_step"] / (entry["median_step_ms"] / 1e3))
            assert ("fallbacks" in entry) == (device == "sim")
        cpu = row["devices"]["cpu"].get("throughput")
        if cpu is not None:
            assert row["ratios"]["cpu"] == pytest.approx(1.0)
            assert row["ratios"]["sim"] == pytest.approx(row["devices"]["sim"]["throughput"] / cpu)
    text = page.read_text(encoding="utf-8")
    assert "<svg" in text and "</svg>" in text
    assert "<table>" in text and "<th>sim/cpu</th>" in text
    for workload in WORKLOADS:
        assert f"<td>{workload}</td>" in text


@pytest.mark.timeout(120)
def test_text_table_has_a_row_per_workload_and_mode() -> None:
    result = _bench("--quick", "--devices", "sim", "--steps", "1", "--warmup", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["workload", "mode", "unit", "sim"]
    body = [line.split()[:2] for line in lines[3:9]]
    assert body == [[w, m] for w in ("resnet18", "gpt", "lstm") for m in ("train", "infer")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("devices", ["nosuchdev,cpu", "cuda"])
def test_unknown_device_is_a_usage_error(devices: str) -> None:
    result = _bench("--quick", "--devices", devices, timeout=100)
    assert result.returncode == 2, result.stdout + result.stderr
    bad = devices.split(",")[0]
    assert f"unknown device {bad!r}" in result.stderr
    assert "bench:" not in result.stderr  # nothing ran


@pytest.mark.timeout(120)
def test_unknown_device_among_several_is_a_usage_error_before_any_child_runs() -> None:
    result = _bench("--quick", "--devices", "sim,nosuchdev,cpu", timeout=100)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "unknown device 'nosuchdev'" in result.stderr
    for what in ("TORCH_FL_PLUGIN_PATH", "plugin package", "--plugin nosuchdev=PATH"):
        assert what in result.stderr, result.stderr
    assert "bench:" not in result.stderr and not result.stdout  # no child started, nothing timed


@pytest.mark.parametrize("value", ["ocl", "=x.so", "ocl="])
def test_plugin_option_takes_name_equals_path(value: str) -> None:
    from torch_fl.bench_children import parse_plugins

    assert parse_plugins(["ocl=lib/a.so", " sim = b.so "]) == {"ocl": "lib/a.so", "sim": "b.so"}
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_plugins([value])


def test_this_process_measures_one_torch_fl_device_and_children_the_others() -> None:
    from torch_fl.bench_children import plan_devices

    assert plan_devices(["sim", "cpu"], None) == ("sim", [])
    assert plan_devices(["ocl", "sim", "cpu"], None) == (None, ["ocl", "sim"])
    assert plan_devices(["ocl", "sim", "cpu"], "sim") == ("sim", ["ocl"])
    assert plan_devices(["ocl", "cpu"], "sim") == (None, ["ocl"])
    assert plan_devices(["cpu"], None) == (None, [])


def _opencl_plugin() -> str:
    """The OpenCL plugin of the main build, or a skip naming what is missing."""
    if not glob("/etc/OpenCL/vendors/*.icd"):
        pytest.skip("no OpenCL ICD in /etc/OpenCL/vendors (install an OpenCL runtime such as PoCL)")
    library = Path(__file__).resolve().parents[1] / "target" / "release" / "libtorchfl_opencl.so"
    # A git worktree of the repository has no target/ of its own: the main checkout's build serves it.
    candidates = [library, Path("/work/main/target/release/libtorchfl_opencl.so")]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        pytest.skip("the OpenCL plugin is not built (cargo build --release -p torchfl-opencl)")
    return str(found)


@pytest.mark.timeout(600)
def test_several_torch_fl_devices_in_one_run_give_one_report() -> None:
    plugin = _opencl_plugin()
    result = _bench(
        "--quick", "--devices", "ocl,sim,cpu", "--plugin", f"ocl={plugin}", "--threads", "1", "--json", timeout=540
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["devices"] == ["ocl", "sim", "cpu"]  # the order asked
    assert report["baseline"] == "cpu"
    info = report["device_info"]
    assert info["ocl"]["process"] == info["sim"]["process"] == "child" and info["cpu"]["process"] == "this"
    assert info["ocl"]["plugin"].split()[0] == "ocl" and info["sim"]["plugin"] == "sim 0.1.0"
    assert "bench: ocl in a child process" in result.stderr and "bench: gpt train on ocl" in result.stderr
    rows = {(r["workload"], r["mode"]): r for r in report["results"]}
    assert set(rows) == {(w, m) for w in WORKLOADS for m in MODES}
    for row in rows.values():
        assert list(row["devices"]) == ["ocl", "sim", "cpu"]
        cpu = row["devices"]["cpu"].get("throughput")
        for device, entry in row["devices"].items():
            if "skipped" in entry:
                continue
            assert "error" not in entry, (row["workload"], row["mode"], device, entry)
            assert entry["throughput"] > 0 and entry["steps"] == 3
            assert ("fallbacks" in entry) == (device != "cpu")
            assert row["ratios"][device] == pytest.approx(entry["throughput"] / cpu)


@pytest.mark.timeout(300)
def test_a_failing_child_is_an_error_cell_and_exit_1_and_the_table_still_prints() -> None:
    result = _bench(
        "--quick", "--devices", "bad,sim,cpu", "--plugin", "bad=/nonexistent.so", "--steps", "1", "--warmup", "0",
        "--threads", "1", timeout=240,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["workload", "mode", "unit", "bad", "sim", "cpu", "bad/cpu", "sim/cpu"]
    for line in lines[3:9]:
        cells = line.split()
        assert cells[3] == "error" and cells[6] == "-", line
        assert cells[5] not in ("error", "-"), line  # cpu was measured
    assert "devices: bad (child process" in result.stdout
    assert "bad could not be measured: cannot register the device 'bad': PluginFileNotFoundError" in result.stdout
    assert "/nonexistent.so" in result.stdout  # the child's stderr tail is shown


@pytest.mark.timeout(180)
def test_a_child_is_killed_on_timeout_and_reported(tmp_path: Path) -> None:
    from torch_fl import _paths

    page = tmp_path / "r.html"
    # Two torch-fl devices (the simulator twice, under two names), so both run in children; far too many
    # steps for the timeout.
    result = _bench(
        "--quick", "--devices", "sim,simtwo", "--plugin", f"simtwo={_paths.SIM_PLUGIN}", "--steps", "100000",
        "--timeout", "4", "--json", "--html", str(page), timeout=150,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    for device in ("sim", "simtwo"):
        error = f"the child process measuring {device!r} was killed after 4 s (--timeout)"
        assert report["device_info"][device]["error"] == error
        assert report["device_info"][device]["seconds"] < 60
        for row in report["results"]:
            assert row["devices"][device]["error"] == error and row["ratios"][device] is None
    assert "could not be measured" in page.read_text(encoding="utf-8")


def test_run_child_kills_on_timeout_and_keeps_the_stderr_tail() -> None:
    from torch_fl.bench_children import run_child

    code = "import sys, time\nfor i in range(40): print('line', i, file=sys.stderr)\nsys.stderr.flush()\ntime.sleep(60)"
    start = time.monotonic()
    returncode, stdout, tail, seconds = run_child([sys.executable, "-c", code], timeout=3, progress=False)
    assert returncode is None and stdout == ""
    assert tail.splitlines()[-1] == "line 39" and len(tail.splitlines()) == 15
    assert seconds < 30 and time.monotonic() - start < 30


def test_a_child_without_a_json_report_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_fl import bench_children

    def garbage(device: str, args: argparse.Namespace, plugin_path: str | None) -> list[str]:
        return [sys.executable, "-c", "import sys; print('not json'); print('boom', file=sys.stderr)"]

    monkeypatch.setattr(bench_children, "child_command", garbage)
    args = argparse.Namespace(timeout=60)
    result = bench_children.measure_in_child("ocl", args, {}, progress=False)
    assert result.returncode == 0 and result.report is None
    assert result.error == "the child process measuring 'ocl' printed no JSON report for it"
    assert result.stderr_tail == "boom"


def test_text_and_html_list_skips_errors_and_fallbacks() -> None:
    from torch_fl.bench import render_html, render_text

    machine = {"platform": "p", "cpu_count": 2, "torch_threads": 1}
    no_tv = {"skipped": "torchvision is not importable"}
    rows = [
        {"workload": "resnet18", "mode": "train", "unit": "samples/s", "ratios": {"sim": None, "cpu": None},
         "devices": {"sim": no_tv, "cpu": no_tv}},
        {"workload": "lstm", "mode": "train", "unit": "samples/s", "ratios": {"sim": 0.5, "cpu": 1.0},
         "devices": {"sim": {"throughput": 5.0, "fallbacks": {"aten::foo": 3}}, "cpu": {"throughput": 10.0}}},
        {"workload": "gpt", "mode": "infer", "unit": "tokens/s", "ratios": {"sim": None, "cpu": 1.0},
         "devices": {"sim": {"error": "RuntimeError: boom"}, "cpu": {"throughput": 10.0}}},
    ]  # fmt: skip
    report = {"machine": machine, "torch": "t", "torch_fl": "f", "devices": ["sim", "cpu"], "baseline": "cpu",
              "quick": True, "warmup": 1, "steps": 3, "results": rows}  # fmt: skip
    text = render_text(report)
    assert "resnet18 skipped: torchvision is not importable" in text
    assert "lstm train on sim: CPU fallbacks aten::foo x3" in text
    assert "gpt infer on sim failed: RuntimeError: boom" in text
    assert text.count("resnet18 skipped") == 1
    page = render_html(report)
    assert "<svg" in page and "aten::foo x3" in page and "<td>skipped</td>" in page and "<td>error</td>" in page


class _Cosh(torch.nn.Module):
    """A model with an operator the simulator lacks (``cosh``, see test_fallback.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cosh(self.linear(x))


def test_measure_counts_cpu_fallbacks_on_the_device() -> None:
    from torch_fl import bench

    def build(quick: bool) -> bench._Case:
        return bench._Case(_Cosh(), torch.randn(2, 4), torch.randint(0, 3, (2,)), torch.nn.functional.cross_entropy, 2)

    args = argparse.Namespace(quick=True, warmup=1, steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the once-per-operator fallback warning
        on_sim = bench._measure(build, DEVICE, "infer", args)
        on_cpu = bench._measure(build, "cpu", "infer", args)
    assert sum(n for op, n in on_sim["fallbacks"].items() if op.split(".")[0] == "cosh") == 3, on_sim
    assert on_sim["steps"] == 2 and on_sim["throughput"] > 0
    assert "fallbacks" not in on_cpu and on_cpu["throughput"] > 0


@pytest.mark.timeout(120)
def test_resnet18_is_skipped_with_the_reason_without_torchvision(tmp_path: Path) -> None:
    shadow = tmp_path / "torchvision"
    shadow.mkdir()
    (shadow / "__init__.py").write_text('raise ImportError("no torchvision here")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch_fl", "bench", "--quick", "--devices", "sim", "--steps", "1", "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=100, check=False, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(result.stdout)["results"]
    for row in rows:
        entry = row["devices"]["sim"]
        if row["workload"] == "resnet18":
            assert entry == {"skipped": "torchvision is not importable (ImportError: no torchvision here)"}
        else:
            assert entry["throughput"] > 0
