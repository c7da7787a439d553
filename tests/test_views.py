"""Views share the storage of their base, as on every PyTorch device."""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICE, assert_close

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


def test_views_share_storage() -> None:
    x = torch.zeros(4, 6, device=DEVICE)
    v = x.view(2, 12)
    r = x[1:3]
    t = x.t()
    assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    v.add_(1)
    r.mul_(3)
    t[0, 0] = 5.0  # writes through the transpose
    expected = torch.ones(4, 6)
    expected[1:3] *= 3
    expected[0, 0] = 5.0
    assert_close(x, expected)


def test_view_metadata_ops() -> None:
    x = torch.arange(24.0).to(DEVICE)
    base = torch.arange(24.0)
    assert_close(x.reshape(2, 3, 4).permute(2, 0, 1), base.reshape(2, 3, 4).permute(2, 0, 1))
    assert_close(x.view(4, 6)[:, 2], base.view(4, 6)[:, 2])
    assert_close(x.unsqueeze(0).expand(3, 24), base.unsqueeze(0).expand(3, 24))
    assert_close(x.unfold(0, 4, 4), base.unfold(0, 4, 4))
    assert_close(x.as_strided((3, 3), (5, 1), 2), base.as_strided((3, 3), (5, 1), 2))


def test_resize_keeps_existing_values() -> None:
    x = torch.arange(4.0).to(DEVICE)
    x.resize_(8)
    assert x.shape == (8,)
    assert_close(x[:4], torch.arange(4.0))


def test_set_shares_storage() -> None:
    a = torch.arange(6.0).to(DEVICE)
    b = torch.empty(0, device=DEVICE)
    b.set_(a)
    assert b.data_ptr() == a.data_ptr()
    b.set_(a.untyped_storage(), 2, (2,), (1,))
    assert_close(b, torch.tensor([2.0, 3.0]))
