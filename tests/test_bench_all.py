"""The benchmark driver runs end to end and reports every key (benches/python/bench_all.py).

It measures nothing here: the run is CI-sized (``--quick``) and only the
shape of its summary is checked, never a figure. Marked ``bench`` (about a
minute): ``pytest -m "not bench"`` leaves it out.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.bench


def bench_all_module() -> Any:
    """The driver script as a module (for its ``KEYS`` and ``RESNET_KEYS``)."""
    spec = importlib.util.spec_from_file_location("bench_all", ROOT / "benches/python/bench_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(1500)
def test_quick_run_prints_every_key_as_its_last_line() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benches/python/bench_all.py"), "--quick", "--json", "--timeout", "600"],
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert isinstance(summary, dict)
    driver = bench_all_module()
    keys: tuple[str, ...] = driver.KEYS
    issue_17 = {"tiny_add_ratio", "register_100_ops_ms", "layer_share_pct", "pcie_alloc_share_pct"}
    assert issue_17 | {"pcie_nocache_over_cache", "copy_overlap_ratio"} <= set(keys)
    # Without torchvision (a torch release none pairs with yet) the
    # ResNet-18 keys cannot be measured and must say so; all else must be.
    unmeasurable = set(driver.RESNET_KEYS) if importlib.util.find_spec("torchvision") is None else set()
    for key in keys:
        value = summary[key]
        if key in unmeasurable:
            assert value == driver.NO_TORCHVISION, f"{key}: {value!r}"
            continue
        # A benchmark that failed reports "failed: ..." instead, which
        # fails this test.
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{key}: {value!r}"
        assert math.isfinite(value) and value >= 0, f"{key}: {value!r}"
    if not unmeasurable:
        assert summary["pcie_nocache_over_cache"] > 0 and summary["copy_overlap_ratio"] > 0


def test_without_torchvision_the_resnet_keys_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = bench_all_module()
    real_find_spec = importlib.util.find_spec
    # The driver asks importlib.util, the process-wide module: patched for
    # this test only, every other lookup still answered.
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torchvision" else real_find_spec(name, *a),
    )
    ran: list[str] = []

    def fake_run_json(args: list[str], env: dict[str, str] | None, timeout: float) -> Any:
        ran.append(Path(args[0]).name)
        if ran[-1] == "bench_dispatch.py":
            return {"add": {"ratio": 1.25}, "register": {"median_ms": 2.0}}
        return {}

    monkeypatch.setattr(driver, "run_json", fake_run_json)
    summary = driver.collect(quick=True, timeout=10.0)
    assert "bench_training.py" not in ran  # no subprocess doomed to fail on the import
    assert summary["tiny_add_ratio"] == 1.25 and summary["register_100_ops_ms"] == 2.0
    for key in driver.RESNET_KEYS:
        assert summary[key] == driver.NO_TORCHVISION
    assert summary["details"]["training"] == driver.NO_TORCHVISION
