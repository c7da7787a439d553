"""torch-fl's caching allocator: reuse, pools, splitting, streams, OOM retry, statistics, settings.

The allocator (cpp_shim/src/memory/caching_allocator.h) is observed the way CUDA
users observe theirs: through ``memory_stats`` (``num_device_alloc`` counts
the plugin allocate calls), ``memory_snapshot`` (segments and blocks) and
tensors' ``data_ptr``. Tests that need a fresh allocator or settings run in
a fresh interpreter.
"""

from __future__ import annotations

import pytest
import torch

import torch_fl

from .conftest import assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

MiB = 1 << 20


def device_allocs(device: int = 0) -> int:
    return int(torch.sim.memory_stats(device)["num_device_alloc"])


def segments(device: int = 0) -> list[dict]:
    return [s for s in torch.sim.memory_snapshot() if s["device"] == device]


def block_of(t: torch.Tensor) -> tuple[dict, dict]:
    """The snapshot's segment and block that hold ``t``."""
    for segment in segments(t.device.index):
        for block in segment["blocks"]:
            if block["address"] == t.data_ptr():
                return segment, block
    raise AssertionError(f"no block at {t.data_ptr():#x}")


def test_caching_is_the_default_backend() -> None:
    assert torch.sim.get_allocator_backend() == "caching"


def test_steady_state_allocations_never_reach_the_plugin() -> None:
    def step() -> None:
        x = torch.randn(64, 128, device="sim")
        w = torch.randn(128, 256, device="sim")
        y = (x @ w).relu().sum()
        y.item()

    step()
    before = device_allocs()
    for _ in range(20):
        step()
    assert device_allocs() == before, "a repeated step allocated from the plugin again"
    assert torch.sim.memory_stats()["allocation.all.allocated"] > 0


def test_a_freed_block_is_reused_on_the_same_stream_only() -> None:
    # Fresh process: addresses depend on what else is cached.
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            x = torch.empty(256 * 1024, dtype=torch.uint8, device="sim")
            address = x.data_ptr()
            del x
            y = torch.empty(256 * 1024, dtype=torch.uint8, device="sim")
            print("same-stream reuse", y.data_ptr() == address)
            del y
            side = torch.sim.Stream()
            with torch.sim.stream(side):
                s = torch.empty(300 * 1024, dtype=torch.uint8, device="sim")
                side_address = s.data_ptr()
                s.fill_(1)
                del s
            d = torch.empty(300 * 1024, dtype=torch.uint8, device="sim")
            print("other stream reuse", d.data_ptr() == side_address)
            with torch.sim.stream(side):
                s = torch.empty(300 * 1024, dtype=torch.uint8, device="sim")
                print("side reuses its own", s.data_ptr() == side_address)
            """
        )
    )
    assert out.splitlines() == ["same-stream reuse True", "other stream reuse False", "side reuses its own True"]


def test_blocks_split_and_merge_again_when_freed() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            a = torch.empty(256 * 1024, dtype=torch.uint8, device="sim")
            b = torch.empty(256 * 1024, dtype=torch.uint8, device="sim")
            print(b.data_ptr() == a.data_ptr() + 256 * 1024)
            (segment,) = torch.sim.memory_snapshot()
            print([blk["state"] for blk in segment["blocks"]])
            print(torch.sim.memory_stats()["inactive_split.all.current"])
            del a
            (segment,) = torch.sim.memory_snapshot()
            print([blk["state"] for blk in segment["blocks"]])
            del b
            (segment,) = torch.sim.memory_snapshot()
            print([blk["state"] for blk in segment["blocks"]], segment["blocks"][0]["size"] == 2 << 20)
            print(torch.sim.memory_stats()["inactive_split.all.current"])
            """
        )
    )
    assert out.splitlines() == [
        "True",
        "['active_allocated', 'active_allocated', 'inactive']",
        "1",
        "['inactive', 'active_allocated', 'inactive']",
        "['inactive'] True",
        "0",
    ]


def test_small_and_large_pools_and_segment_sizes() -> None:
    small = torch.empty(1000, dtype=torch.uint8, device="sim:1")
    medium = torch.empty(3 * MiB, dtype=torch.uint8, device="sim:1")
    big = torch.empty(25 * MiB + 1, dtype=torch.uint8, device="sim:1")
    seg, block = block_of(small)
    assert seg["segment_type"] == "small" and seg["total_size"] == 2 * MiB
    assert block["size"] == 1024 and block["requested_size"] == 1000  # rounded to 512 bytes
    seg, _ = block_of(medium)
    assert seg["segment_type"] == "large" and seg["total_size"] == 20 * MiB  # requests under 10 MiB
    seg, block = block_of(big)
    assert seg["total_size"] == 26 * MiB  # its own segment, rounded to 2 MiB
    # The remainder (under 1 MiB) is too small to split off a large block.
    assert block["size"] == 26 * MiB and block["requested_size"] == 25 * MiB + 1
    del small, medium, big


def test_statistics_agree_with_the_snapshot() -> None:
    keep = [torch.empty(n, dtype=torch.uint8, device="sim:1") for n in (100, 5000, 2 * MiB, 11 * MiB)]
    stats = torch.sim.memory_stats(1)
    segs = segments(1)
    assert stats["reserved_bytes.all.current"] == sum(s["total_size"] for s in segs)
    assert stats["allocated_bytes.all.current"] == sum(s["allocated_size"] for s in segs)
    assert stats["segment.all.current"] == len(segs)
    for key in ("allocated_bytes", "reserved_bytes", "allocation", "segment", "inactive_split_bytes"):
        assert stats[f"{key}.all.current"] == stats[f"{key}.small_pool.current"] + stats[f"{key}.large_pool.current"]
    split_free = [b for s in segs for b in s["blocks"] if b["state"] == "inactive" and len(s["blocks"]) > 1]
    assert stats["inactive_split.all.current"] == len(split_free)
    assert stats["inactive_split_bytes.all.current"] == sum(b["size"] for b in split_free)
    assert torch.sim.memory_reserved(1) == stats["reserved_bytes.all.current"]
    del keep


def test_record_stream_delays_reuse_until_the_other_stream_ran() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            side = torch.sim.Stream()
            x = torch.ones(1 << 16, device="sim")
            address = x.data_ptr()
            side.wait_stream(torch.sim.current_stream())
            with torch.sim.stream(side):
                total = x.sum()
            x.record_stream(side)
            del x
            def state():
                return [b["state"] for s in torch.sim.memory_snapshot() for b in s["blocks"] if b["address"] == address]
            # Pending until the side stream's sum has run (it may already have).
            print(state() in (["active_pending_free"], ["inactive"]))
            side.synchronize()
            y = torch.empty(1 << 16, device="sim")  # an allocation looks at pending frees
            print(y.data_ptr() == address, total.item())
            """
        )
    )
    assert out.split() == ["True", "True", "65536.0"]


def test_record_stream_with_writes_on_both_streams_stays_correct() -> None:
    # Strict mode (TORCH_FL_SIM_STRICT=1) checks that no stream touches
    # memory another stream still uses; the values check the rest.
    side = torch.sim.Stream(device="sim:1")
    results = []
    for i in range(8):
        x = torch.full((4096,), float(i), device="sim:1")
        side.wait_stream(torch.sim.current_stream(1))
        with torch.sim.stream(side):
            results.append((x * 2).sum())
        x.record_stream(side)
        del x
        torch.full((4096,), -1.0, device="sim:1")  # wants the same size on the default stream
    torch.sim.current_stream(1).wait_stream(side)
    assert [r.item() for r in results] == [8192.0 * i for i in range(8)]


def test_empty_cache_returns_free_segments_to_the_plugin() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            keep = torch.empty(1000, device="sim")
            tmp = [torch.empty(3 << 20, dtype=torch.uint8, device="sim") for _ in range(10)]
            del tmp
            before = torch.sim.memory_reserved()
            torch.sim.empty_cache()
            stats = torch.sim.memory_stats()
            print(before > torch.sim.memory_reserved(), torch.sim.memory_reserved() == 2 << 20,
                  stats["num_device_free"] > 0, len(torch.sim.memory_snapshot()))
            """
        )
    )
    assert out.split() == ["True", "True", "True", "1"]


def test_out_of_memory_releases_the_cache_and_retries() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            # 40 MiB cached in a 40 MiB segment, then a 50 MiB request: only
            # fits once the cached segment went back to the plugin.
            x = torch.empty(40 << 20, dtype=torch.uint8, device="sim")
            del x
            y = torch.empty(50 << 20, dtype=torch.uint8, device="sim")
            stats = torch.sim.memory_stats()
            print("retries", stats["num_alloc_retries"], "ooms", stats["num_ooms"])
            try:
                torch.empty(50 << 20, dtype=torch.uint8, device="sim")
            except torch.OutOfMemoryError as e:
                message = str(e)
                print("OOM", "sim:0" in message, "reserved but unallocated" in message, "PYTORCH_ALLOC_CONF" in message)
            print("ooms", torch.sim.memory_stats()["num_ooms"])
            print(torch.ones(4, device="sim").sum().item())
            """,
            env={"TORCH_FL_SIM_MEMORY": "64MiB"},
        )
    )
    assert out.split() == ["retries", "1", "ooms", "0", "OOM", "True", "True", "True", "ooms", "1", "4.0"]


def test_another_streams_free_segment_is_taken_when_memory_is_short() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            side = torch.sim.Stream()
            with torch.sim.stream(side):
                x = torch.full((10 << 20,), 7.0, device="sim")  # 40 MiB
                address = x.data_ptr()
                del x
            # A new segment does not fit next to the cached one: the default
            # stream takes the side stream's segment after an event wait.
            y = torch.zeros(10 << 20, device="sim")
            print(y.data_ptr() == address, torch.sim.memory_stats()["num_alloc_retries"], y.sum().item())
            """,
            env={"TORCH_FL_SIM_MEMORY": "64MiB"},
        )
    )
    assert out.split() == ["True", "0", "0.0"]


def test_the_plugin_backend_passes_every_allocation_through() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            print(torch.sim.get_allocator_backend())
            torch.sim.reset_accumulated_memory_stats()
            for _ in range(5):
                torch.empty(1000, device="sim")
            print(torch.sim.memory_stats()["num_device_alloc"], len(torch.sim.memory_snapshot()))
            """,
            env={"TORCH_FL_ALLOC_CONF": "backend:plugin"},
        )
    )
    assert out.split() == ["plugin", "5", "0"]


@pytest.mark.mode_independent  # refused at registration, before any mode applies
@pytest.mark.parametrize(
    ("value", "words"),
    [("backend:cuda", "backend must be"), ("max_split_size_mb:64", "PYTORCH_ALLOC_CONF")],
)
def test_an_invalid_setting_is_refused_at_registration(value: str, words: str) -> None:
    out = assert_ok(
        run_python(
            """
            import torch_fl
            try:
                torch_fl.register_device_plugin(name="sim")
            except torch_fl.InvalidSettingError as e:
                print("refused:", e)
            """,
            env={"TORCH_FL_ALLOC_CONF": value},
        )
    )
    assert out.startswith("refused: TORCH_FL_ALLOC_CONF=")
    assert "backend:plugin" in out and words in out


def test_pytorch_alloc_conf_settings_apply() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            big = torch.empty(30 << 20, dtype=torch.uint8, device="sim")
            del big
            # Blocks above max_split_size are never split: a small request
            # does not take the cached 30 MiB block.
            small = torch.empty(12 << 20, dtype=torch.uint8, device="sim")
            stats = torch.sim.memory_stats()
            print(stats["max_split_size"] == 24 << 20, stats["segment.all.current"])
            # roundup_power2_divisions:4 rounds 1.2 MiB up to 1.25 MiB.
            x = torch.empty(1258291, dtype=torch.uint8, device="sim")
            blocks = [b for s in torch.sim.memory_snapshot() for b in s["blocks"]]
            sizes = [b["size"] for b in blocks if b["address"] == x.data_ptr()]
            print(sizes == [5 << 18])
            """,
            env={"PYTORCH_ALLOC_CONF": "max_split_size_mb:24,roundup_power2_divisions:4"},
        )
    )
    assert out.split() == ["True", "2", "True"]


def test_the_layer_profile_counts_plugin_allocations() -> None:
    x = torch.randn(32, 32, device="sim")
    (x @ x).sum().item()
    with torch_fl.profile_layers() as caching:
        for _ in range(10):
            (x @ x).sum().item()
    assert caching.alloc_calls == 0
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            x = torch.randn(32, 32, device="sim")
            with torch_fl.profile_layers() as p:
                for _ in range(10):
                    (x @ x).sum().item()
            print(p.alloc_calls >= 20, p.alloc_s > 0)
            """,
            env={"TORCH_FL_ALLOC_CONF": "backend:plugin"},
        )
    )
    assert out.split() == ["True", "True"]


def test_a_plugin_that_caches_itself_gets_allocations_passed_through() -> None:
    # TFL_CAP_CACHING_ALLOCATOR (ABI 1.4): the simulator declares it with
    # self_caching=1, and torch-fl then does not cache on top.
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            print(torch.sim.get_allocator_backend())
            torch.sim.reset_accumulated_memory_stats()
            x = torch.ones(1000, device="sim")
            print(torch.sim.memory_stats()["num_device_alloc"], len(torch.sim.memory_snapshot()), x.sum().item())
            """,
            env={"TORCH_FL_SIM_SELF_CACHING": "1"},
        )
    )
    assert out.split() == ["plugin", "1", "0", "1000.0"]
