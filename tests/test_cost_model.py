"""The simulator's cost model and ABI 1.4's page-locked host memory.

The cost model (``TORCH_FL_SIM_COST_MODEL`` and the individual
``TORCH_FL_SIM_*`` keys, documented in crates/torchfl-sim/src/runtime/config.rs) is
read when the plugin initializes, so each configuration runs in a fresh
process. The tests check behaviour under a cost model (results, statistics,
capabilities, where pinned memory comes from and how copies were charged),
never how long anything took.

The simulator's pinned-memory counters come from its debug query
``torch_fl_sim_debug_host_memory``, an exported C function outside the
ABI, reached through ``ctypes``: [host_allocate calls, host_deallocate calls,
live pinned bytes, copies charged at pinned bandwidth, copies charged at
pageable bandwidth]; the two copy counters count only under a cost model.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from .conftest import DEVICE, HANDLE, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

#: Fresh-process preamble: the device, and the simulator's debug query.
PREAMBLE = """
import ctypes, torch, torch_fl
h = torch_fl.register_device_plugin(name="sim")
_query = ctypes.CDLL(h.plugin.path).torch_fl_sim_debug_host_memory
_query.restype = ctypes.c_size_t
_query.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]

def host_stats():
    buf = (ctypes.c_uint64 * 5)()
    assert _query(buf, 5) == 5
    return dict(zip(("allocs", "frees", "live", "pinned_copies", "pageable_copies"), buf))
"""

PCIE = {"TORCH_FL_SIM_COST_MODEL": "pcie-gpu"}


def host_stats() -> dict[str, int]:
    """This process's simulator counters (see the module docstring)."""
    assert HANDLE.plugin.path is not None
    query = ctypes.CDLL(HANDLE.plugin.path).torch_fl_sim_debug_host_memory
    query.restype = ctypes.c_size_t
    query.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    buf = (ctypes.c_uint64 * 5)()
    assert query(buf, 5) == 5
    return dict(zip(("allocs", "frees", "live", "pinned_copies", "pageable_copies"), buf, strict=True))


def test_pinned_tensors_live_in_the_plugins_host_memory() -> None:
    before = host_stats()
    x = torch.arange(3000.0).pin_memory()
    assert x.is_pinned()
    after = host_stats()
    # A block the size of x (rounded up by the host's pinned cache) is live;
    # it came from host_allocate now or from an earlier, cached block.
    assert after["live"] >= x.numel() * x.element_size()
    assert after["allocs"] >= max(before["allocs"], 1)
    y = x.to(DEVICE, non_blocking=True)
    torch.sim.synchronize()
    torch.testing.assert_close(y.cpu(), x)


def test_no_cost_model_by_default() -> None:
    """The default configuration charges nothing, so it never classifies copies."""
    result = run_python(
        PREAMBLE
        + """
x = torch.arange(100.0).pin_memory()
y = x.to("sim", non_blocking=True)
z = torch.arange(100.0).to("sim")
torch.sim.synchronize()
s = host_stats()
assert s["allocs"] >= 1 and s["pinned_copies"] == 0 and s["pageable_copies"] == 0, s
assert "caching_allocator" not in h.capabilities, h.capabilities
print("ok")
""",
        env={"TORCH_FL_SIM_COST_MODEL": "off"},
        timeout=120,
    )
    assert assert_ok(result).strip().endswith("ok")


def test_copies_are_charged_at_pinned_or_pageable_bandwidth() -> None:
    result = run_python(
        PREAMBLE
        + """
def copies():
    s = host_stats()
    return s["pinned_copies"], s["pageable_copies"]

x = torch.arange(1000.0)
pinned = x.pin_memory()
s0 = host_stats()
assert s0["allocs"] >= 1 and s0["live"] >= 4000, s0
c0 = copies()
a = pinned.to("sim", non_blocking=True)      # from pinned memory
c1 = copies()
assert c1 == (c0[0] + 1, c0[1]), (c0, c1)
b = x.to("sim", non_blocking=True)           # pageable: one copy, direct or staged through pinned memory
c2 = copies()
assert sum(c2) == sum(c1) + 1, (c1, c2)
back = torch.empty(1000, pin_memory=True)
c3 = copies()
back.copy_(a + b, non_blocking=True)         # device to pinned host
torch.sim.synchronize()
c4 = copies()
assert c4 == (c3[0] + 1, c3[1]), (c3, c4)
torch.testing.assert_close(back, 2 * x)
host = (a * b).cpu()                         # device to pageable host
c5 = copies()
assert c5 == (c4[0], c4[1] + 1), (c4, c5)
torch.testing.assert_close(host, x * x)
print("ok")
""",
        env=PCIE,
        timeout=120,
    )
    assert assert_ok(result).strip().endswith("ok")


def test_allocation_latency_keeps_results_and_statistics_right() -> None:
    result = run_python(
        PREAMBLE
        + """
n = 1 << 18
x = torch.ones(n, device="sim")
stats = h.plugin.memory_stats(0)
assert stats["allocated_bytes"] >= 4 * n, stats
assert stats["num_allocations"] >= 1, stats
ys = [x * i for i in range(5)]                  # allocations while work is queued
assert [y.sum().item() for y in ys] == [float(i * n) for i in range(5)]
frees = h.plugin.memory_stats(0)["num_frees"]
del ys
torch.sim.synchronize()
torch.sim.empty_cache()
after = h.plugin.memory_stats(0)
assert after["allocated_bytes"] >= 4 * n and after["num_frees"] >= frees, (stats, after)
print("ok")
""",
        env={
            **PCIE,
            "TORCH_FL_SIM_ALLOC_LATENCY_US": "50",
            "TORCH_FL_SIM_ALLOC_SYNC": "1",
            "TORCH_FL_SIM_COMPUTE_FACTOR": "2",
        },
        timeout=120,
    )
    assert assert_ok(result).strip().endswith("ok")


def test_a_model_step_is_correct_under_the_pcie_preset() -> None:
    result = run_python(
        PREAMBLE
        + """
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
inputs = torch.randn(8, 16)
expected = model(inputs)
dev = model.to("sim")
out = dev(inputs.pin_memory().to("sim", non_blocking=True))
out.sum().backward()
torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
assert all(p.grad is not None for p in dev.parameters())
print("ok")
""",
        env={**PCIE, "TORCH_FL_SIM_COMPUTE_FACTOR": "1.5"},
        timeout=120,
    )
    assert assert_ok(result).strip().endswith("ok")


@pytest.mark.parametrize("self_caching", ["0", "1"])
def test_self_caching_reports_the_capability(self_caching: str) -> None:
    result = run_python(
        PREAMBLE
        + """
x = torch.ones(1000, device="sim")
assert (x + 1).sum().item() == 2000.0
print(",".join(h.capabilities))
""",
        env={**PCIE, "TORCH_FL_SIM_SELF_CACHING": self_caching},
        timeout=120,
    )
    capabilities = assert_ok(result).strip().splitlines()[-1].split(",")
    assert ("caching_allocator" in capabilities) == (self_caching == "1"), capabilities


@pytest.mark.mode_independent  # refused at registration, before any mode applies
@pytest.mark.parametrize(
    ("variable", "value", "accepted"),
    [
        ("TORCH_FL_SIM_COST_MODEL", "tpu", "pcie-gpu"),
        ("TORCH_FL_SIM_COMPUTE_FACTOR", "0.5", "1.0 to 1000"),
        ("TORCH_FL_SIM_PINNED_GBPS", "fast", "GB/s"),
        ("TORCH_FL_SIM_SELF_CACHING", "2", "0 or 1"),
    ],
)
def test_an_invalid_cost_setting_is_refused_naming_it(variable: str, value: str, accepted: str) -> None:
    result = run_python(
        """
import torch_fl
try:
    torch_fl.register_device_plugin(name="sim")
except torch_fl.TorchFLError as e:
    print("refused:", e)
""",
        env={variable: value},
        timeout=120,
    )
    out = assert_ok(result)
    assert "refused:" in out, out
    assert variable in out and repr(value).replace("'", '"') in out and accepted in out, out
