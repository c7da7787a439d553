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
