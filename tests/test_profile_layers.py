"""torch_fl.profile_layers: torch-fl's own time versus plugin kernels.

PyTorch's profilers on the device are tested in test_torch_profiler.py.
"""

from __future__ import annotations

import pytest
import torch

import torch_fl
from torch_fl import _C

from .conftest import DEVICE

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def test_counts_operator_entries_and_kernel_calls() -> None:
    a = torch.ones(8, device=DEVICE)
    with torch_fl.profile_layers() as p:
        for _ in range(10):
            a = a + 1  # one plugin kernel (and one allocation inside it) per call
        torch.empty(3, device=DEVICE)  # a shim-implemented factory: an entry, no kernel
    assert p.kernel_calls == 10
    assert p.entries == 11, "nested entries (the add's allocation) count once"
    assert 0 < p.kernel_s <= p.entry_s
    assert 0 < p.layer_s < p.wall_s
    assert 0 < p.layer_share < 1
    torch.testing.assert_close(a.cpu(), torch.full((8,), 11.0))


def test_off_outside_the_block() -> None:
    with torch_fl.profile_layers():
        torch.ones(2, device=DEVICE).add_(1)
    before = _C.layer_profile()
    torch.ones(2, device=DEVICE).add_(1)
    assert _C.layer_profile() == before


def test_an_empty_block_measures_nothing() -> None:
    with torch_fl.profile_layers() as p:
        pass
    assert (p.entries, p.kernel_calls, p.layer_s) == (0, 0, 0.0)
    assert p.wall_s >= 0


def test_entries_are_counted_per_operator() -> None:
    a = torch.ones(8, device=DEVICE)
    with torch_fl.profile_layers() as p:
        for _ in range(4):
            a = a + 1
        torch.empty(3, device=DEVICE)
    assert sum(op.entries for op in p.operators.values()) == p.entries == 5
    assert p.operators["aten::empty.memory_format"].entries == 1
    assert p.operators["aten::empty.memory_format"].kernel_s == 0, "a shim-implemented factory calls no kernel"
    add = p.operators["aten::add.Tensor"]
    assert add.entries == 4
    assert 0 < add.kernel_s <= add.entry_s
    assert sum(op.kernel_s for op in p.operators.values()) == pytest.approx(p.kernel_s)
    assert sum(op.layer_s for op in p.operators.values()) == pytest.approx(p.layer_s)


def test_top_operators_sorts_by_layer_time() -> None:
    x = torch.ones(4, 4, device=DEVICE)
    with torch_fl.profile_layers() as p:
        for _ in range(3):
            x = (x * 2).relu()
        x.sum()
    top = p.top_operators()
    assert {name for name, _ in top} == set(p.operators)
    assert [op.layer_s for _, op in top] == sorted((op.layer_s for op in p.operators.values()), reverse=True)
    assert p.top_operators(1) == top[:1]


def test_each_block_starts_with_no_operators() -> None:
    with torch_fl.profile_layers():
        torch.ones(2, device=DEVICE).neg()
    with torch_fl.profile_layers() as p:
        pass
    assert p.operators == {}
