"""torch_fl.profile_layers: torch-fl's own time versus plugin kernels."""

from __future__ import annotations

import pytest
import torch

import torch_fl
from torch_fl import _native

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
    before = _native.layer_profile()
    torch.ones(2, device=DEVICE).add_(1)
    assert _native.layer_profile() == before


def test_an_empty_block_measures_nothing() -> None:
    with torch_fl.profile_layers() as p:
        pass
    assert (p.entries, p.kernel_calls, p.layer_s) == (0, 0, 0.0)
    assert p.wall_s >= 0
