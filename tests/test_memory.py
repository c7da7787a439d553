"""Memory statistics and out-of-memory."""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICE, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def test_allocations_are_accounted() -> None:
    torch.sim.synchronize()
    before = torch.sim.memory_allocated()
    x = torch.empty(1 << 20, dtype=torch.uint8, device=DEVICE)
    assert torch.sim.memory_allocated() >= before + (1 << 20)
    assert torch.sim.max_memory_allocated() >= torch.sim.memory_allocated()
    assert torch.sim.memory_reserved() >= torch.sim.memory_allocated()
    stats = torch.sim.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.sim.memory_allocated()
    del x
    torch.sim.synchronize()
    assert torch.sim.memory_allocated() == before
    torch.sim.reset_peak_memory_stats()
    assert torch.sim.max_memory_allocated() == torch.sim.memory_allocated()
    torch.sim.empty_cache()


def test_mem_get_info() -> None:
    free, total = torch.sim.mem_get_info()
    assert 0 < free <= total
    assert total == torch.sim.mem_get_info(1)[1]


def test_per_device_statistics() -> None:
    before = torch.sim.memory_allocated(1)
    y = torch.empty(4096, device="sim:1")
    assert torch.sim.memory_allocated(1) >= before + 4096 * 4
    del y


def test_out_of_memory_is_torch_out_of_memory_error() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            keep = torch.empty(40 << 20, dtype=torch.uint8, device="sim")
            try:
                torch.empty(40 << 20, dtype=torch.uint8, device="sim")
            except torch.OutOfMemoryError as e:
                print("OOM", "sim:0" in str(e) or "device 0" in str(e))
            # The device stays usable.
            print(torch.ones(4, device="sim").sum().item())
            """,
            env={"TORCH_FL_SIM_MEMORY": "64MiB"},
        )
    )
    assert out.split() == ["OOM", "True", "4.0"]


def test_memory_figures_agree_with_torch_accelerator() -> None:
    x = torch.empty(1 << 18, device="sim:1")
    for index in (0, 1):
        assert torch.sim.memory_allocated(index) == torch.accelerator.memory_allocated(index)
        assert torch.sim.memory_reserved(index) == torch.accelerator.memory_reserved(index)
        assert torch.sim.max_memory_reserved(index) == torch.accelerator.max_memory_reserved(index)
        assert torch.sim.mem_get_info(index) == torch.accelerator.get_memory_info(index)
    assert torch.sim.max_memory_reserved(1) >= torch.sim.memory_reserved(1) >= 1 << 20
    del x


def test_peaks_reset() -> None:
    torch.sim.synchronize()
    x = torch.empty(1 << 20, dtype=torch.uint8, device=DEVICE)
    del x
    torch.sim.synchronize()
    assert torch.sim.max_memory_allocated() >= torch.sim.memory_allocated() + (1 << 20)
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.sim.reset_max_memory_allocated()
    assert torch.sim.max_memory_allocated() == torch.sim.memory_allocated()
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.sim.reset_max_memory_cached()
    assert torch.sim.max_memory_reserved() == torch.sim.memory_reserved()


def test_accumulated_counts_reset() -> None:
    torch.sim.reset_accumulated_memory_stats()
    assert torch.sim.memory_stats()["allocation.all.allocated"] == 0
    tensors = [torch.empty(64, device=DEVICE) for _ in range(3)]
    assert torch.sim.memory_stats()["allocation.all.allocated"] == 3
    del tensors
    torch.sim.synchronize()
    assert torch.sim.memory_stats()["allocation.all.freed"] == 3


def test_nested_statistics_match_the_flat_ones() -> None:
    flat = torch.sim.memory_stats()
    nested = torch.sim.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == flat["allocated_bytes.all.current"]
    assert nested["num_ooms"] == flat["num_ooms"]


def test_memory_summary_reads_like_cudas() -> None:
    keep = torch.empty(3 << 20, dtype=torch.uint8, device="sim:1")
    summary = torch.sim.memory_summary(1)
    lines = summary.splitlines()
    assert "PyTorch sim memory summary, device ID 1" in lines[1]
    assert f"sim OOMs: {torch.sim.memory_stats(1)['num_ooms']} " in lines[3]
    assert all(line.startswith("|") and line.endswith("|") for line in lines)
    assert len({len(line) for line in lines}) == 1, "the table's lines have one width"
    allocated = next(line for line in lines if line.startswith("| Allocated memory"))
    number, unit = allocated.split("|")[2].split()
    scale = 1024 ** ["B", "KiB", "MiB", "GiB"].index(unit)
    assert int(number) * scale <= torch.sim.memory_allocated(1) < (int(number) + 1) * scale
    allocations = next(line for line in lines if line.startswith("| Allocations"))
    assert int(allocations.split("|")[2].split()[0]) == torch.sim.memory_stats(1)["allocation.all.current"]
    # As on CUDA: each metric's pool rows, left out when abbreviated.
    pool_rows = [line for line in lines if "from large pool" in line or "from small pool" in line]
    abbreviated = torch.sim.memory_summary(1, abbreviated=True).splitlines()
    metric_rows = [line for line in abbreviated if line[2:3].isalpha() and " | " in line and "Metric" not in line]
    assert len(metric_rows) >= 8 and len(pool_rows) == 2 * len(metric_rows)
    assert [line for line in lines if line not in pool_rows] == abbreviated
    del keep
