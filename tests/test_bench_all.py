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

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.bench


def bench_all_keys() -> tuple[str, ...]:
    """The keys the driver promises (its own ``KEYS``), read from the script."""
    spec = importlib.util.spec_from_file_location("bench_all", ROOT / "benches/python/bench_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    keys: tuple[str, ...] = module.KEYS
    return keys


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
    keys = bench_all_keys()
    issue_17 = {"tiny_add_ratio", "register_100_ops_ms", "layer_share_pct", "pcie_alloc_share_pct"}
    assert issue_17 | {"pcie_nocache_over_cache", "copy_overlap_ratio"} <= set(keys)
    for key in keys:
        # Every figure is measured: a benchmark that failed reports
        # "failed: ..." instead, which fails this test.
        value = summary[key]
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{key}: {value!r}"
        assert math.isfinite(value) and value >= 0, f"{key}: {value!r}"
    assert summary["pcie_nocache_over_cache"] > 0 and summary["copy_overlap_ratio"] > 0
