"""Private memory pools: ``torch.<dev>.MemPool`` and ``use_mem_pool``, as ``torch.cuda``'s.

A pool's tensors come from segments of its own, which no allocation outside
the pool uses; the pool lives while its object or any of its tensors does,
and ``empty_cache`` then gives its segments back. Observed through
``memory_snapshot`` (``segment_pool_id``) and tensors' addresses.
"""

from __future__ import annotations

import threading

import pytest
import torch

from .conftest import assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

MiB = 1 << 20


def pool_of(t: torch.Tensor) -> list[int]:
    """The ``segment_pool_id`` of the segment holding ``t``."""
    address = t.data_ptr()
    for segment in torch.sim.memory_snapshot():
        if (
            segment["device"] == t.device.index
            and segment["address"] <= address < segment["address"] + segment["total_size"]
        ):
            return list(segment["segment_pool_id"])
    raise AssertionError(f"no segment holds {address:#x}")


def test_allocations_inside_use_mem_pool_come_from_the_pool_s_own_segments() -> None:
    pool = torch.sim.MemPool()
    assert pool.id[0] > 0 and pool.id[1] == 0 and pool.use_count() == 1
    outside = torch.ones(1000, device="sim")
    with torch.sim.use_mem_pool(pool):
        small, large = torch.ones(1000, device="sim"), torch.ones(3 * MiB, device="sim")
    after = torch.ones(1000, device="sim")
    assert pool_of(small) == pool_of(large) == list(pool.id)
    assert pool_of(outside) == pool_of(after) == [0, 0]
    assert {s["segment_type"] for s in pool.snapshot()} == {"small", "large"}
    assert all(s["segment_pool_id"] == list(pool.id) for s in pool.snapshot())
    torch.testing.assert_close((small + after).cpu(), torch.full((1000,), 2.0))


def test_a_pool_s_memory_is_never_handed_to_allocations_outside_it() -> None:
    pool = torch.sim.MemPool()
    with torch.sim.use_mem_pool(pool):
        inside = torch.empty(4096, device="sim")
    address = inside.data_ptr()
    del inside  # freed into the pool's cache
    outside = [torch.empty(4096, device="sim") for _ in range(8)]
    assert all(t.data_ptr() != address and pool_of(t) == [0, 0] for t in outside)
    with torch.sim.use_mem_pool(pool):
        again = torch.empty(4096, device="sim")
    assert again.data_ptr() == address  # the pool reuses its own cache


def test_nested_pools_route_to_the_innermost_and_other_threads_are_not_routed() -> None:
    outer, inner = torch.sim.MemPool(), torch.sim.MemPool()
    seen: dict[str, list[int]] = {}

    def other_thread() -> None:
        seen["thread"] = pool_of(torch.empty(100, device="sim"))

    with torch.sim.use_mem_pool(outer):
        a = torch.empty(100, device="sim")
        with torch.sim.use_mem_pool(inner):
            b = torch.empty(100, device="sim")
            worker = threading.Thread(target=other_thread)
            worker.start()
            worker.join(timeout=60)
            assert not worker.is_alive()
        c = torch.empty(100, device="sim")
    assert (pool_of(a), pool_of(b), pool_of(c)) == (list(outer.id), list(inner.id), list(outer.id))
    assert seen["thread"] == [0, 0]


def test_a_pool_lives_while_its_tensors_do_and_empty_cache_then_returns_it() -> None:
    pool = torch.sim.MemPool()
    pool_id, reserved = pool.id, torch.sim.memory_reserved()
    with torch.sim.use_mem_pool(pool):
        kept = torch.arange(3 * MiB // 4, device="sim", dtype=torch.float32)
    assert torch.sim.memory_reserved() > reserved
    del pool  # the object goes; its tensor keeps the memory
    from torch_fl import _C

    assert _C.mempool_use_count(0, pool_id) == 0
    torch.sim.empty_cache()
    assert torch.sim.memory_snapshot(mempool_id=pool_id), "a live tensor's segment was given back"
    assert kept[-1].item() == 3 * MiB // 4 - 1
    del kept
    torch.sim.empty_cache()
    assert torch.sim.memory_snapshot(mempool_id=pool_id) == []


def test_a_pool_is_used_on_its_own_device_only() -> None:
    if torch.sim.device_count() < 2:
        pytest.skip("needs two simulated devices (TORCH_FL_SIM_DEVICES)")
    pool = torch.sim.MemPool()  # on device 0, the current one
    with pytest.raises(RuntimeError, match="belongs to device 0, not 1"), torch.sim.use_mem_pool(pool, device=1):
        pass
    with torch.sim.device(1):
        other = torch.sim.MemPool()
        assert other.device == 1
        with torch.sim.use_mem_pool(other):
            t = torch.empty(10, device="sim:1")
    assert pool_of(t) == list(other.id)


@pytest.mark.mode_independent  # a refusal before any device work
def test_pools_need_the_caching_allocator_and_say_so() -> None:
    code = """
import torch, torch_fl
torch_fl.register_device_plugin(name="sim")
try:
    torch.sim.MemPool()
except RuntimeError as e:
    print("REFUSED", e)
"""
    out = assert_ok(run_python(code, env={"TORCH_FL_ALLOC_CONF": "backend:plugin"}, timeout=120))
    assert "REFUSED" in out and "unset TORCH_FL_ALLOC_CONF" in out, out
