"""``python -m torch_fl bench``: the shape of its report, never its figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime

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
