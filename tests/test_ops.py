"""Operators on the plugin's kernels agree with PyTorch on the CPU:
broadcasting, type promotion, in-place and out= forms."""

from __future__ import annotations

import pytest
import torch

from .conftest import DEVICE, assert_close

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

BINARY = [torch.add, torch.sub, torch.mul, torch.div]
COMPARE = [torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge]


def sample(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(1, 9, shape, dtype=dtype)


@pytest.mark.parametrize("op", BINARY, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((), (4,))])
def test_binary_broadcasting(op, a_shape, b_shape) -> None:
    a, b = sample(a_shape, torch.float32), sample(b_shape, torch.float32) + 3
    assert_close(op(a.to(DEVICE), b.to(DEVICE)), op(a, b))


@pytest.mark.parametrize(
    ("da", "db"),
    [
        (torch.int64, torch.float32),
        (torch.int32, torch.int64),
        (torch.float16, torch.float32),
        (torch.bool, torch.int64),
        (torch.float32, torch.float64),
        (torch.bfloat16, torch.float16),
    ],
)
@pytest.mark.parametrize("op", [torch.add, torch.mul, torch.div], ids=lambda f: f.__name__)
def test_type_promotion_matches_cpu(op, da, db) -> None:
    a, b = sample((2, 3), da), sample((2, 3), db)
    if db == torch.bool:
        b = b.to(torch.int64)
    expected = op(a, b)
    actual = op(a.to(DEVICE), b.to(DEVICE))
    assert actual.dtype == expected.dtype
    assert_close(actual, expected)


@pytest.mark.parametrize("scalar", [2, 2.5, True])
def test_python_scalars(scalar) -> None:
    a = torch.arange(6).reshape(2, 3)
    for x in (a, a.float()):
        assert_close(x.to(DEVICE) * scalar, x * scalar)
        assert_close(x.to(DEVICE) + scalar, x + scalar)
    assert_close(torch.tensor(scalar).to(DEVICE) + a.float().to(DEVICE), torch.tensor(scalar) + a.float())


def test_alpha() -> None:
    a, b = torch.randn(5), torch.randn(5)
    assert_close(torch.add(a.to(DEVICE), b.to(DEVICE), alpha=-2.5), torch.add(a, b, alpha=-2.5))
    assert_close(torch.sub(a.to(DEVICE), b.to(DEVICE), alpha=3), torch.sub(a, b, alpha=3))


@pytest.mark.parametrize("op", COMPARE, ids=lambda f: f.__name__)
def test_comparisons(op) -> None:
    a, b = torch.randint(0, 3, (4, 5)), torch.randint(0, 3, (5,))
    assert_close(op(a.to(DEVICE), b.to(DEVICE)), op(a, b))
    assert_close(op(a.float().to(DEVICE), 1.5), op(a.float(), 1.5))
    assert_close(op(a.to(DEVICE), 1.5), op(a, 1.5))


def test_in_place_forms() -> None:
    a, b = torch.randn(3, 4), torch.randn(4)
    x = a.to(DEVICE)
    ptr = x.data_ptr()
    x.add_(b.to(DEVICE), alpha=2).mul_(3).sub_(1).div_(2)
    assert x.data_ptr() == ptr
    assert_close(x, ((a + 2 * b) * 3 - 1) / 2)
    y = torch.randn(4).to(DEVICE)
    y.neg_()
    y.relu_()
    assert (y.cpu() >= 0).all()
    z = torch.empty(3, device=DEVICE).fill_(2.5)
    assert_close(z, torch.full((3,), 2.5))
    z.zero_()
    assert_close(z, torch.zeros(3))


def test_out_forms_including_resizing() -> None:
    a, b = torch.randn(2, 3), torch.randn(3)
    out = torch.empty(2, 3, device=DEVICE)
    r = torch.add(a.to(DEVICE), b.to(DEVICE), out=out)
    assert r is out
    assert_close(out, a + b)
    # A 0-element out is resized silently, as on the CPU.
    empty = torch.empty(0, device=DEVICE)
    torch.mul(a.to(DEVICE), b.to(DEVICE), out=empty)
    assert_close(empty, a * b)
    m = torch.empty(0, device=DEVICE)
    torch.mm(a.to(DEVICE), torch.randn(3, 4).to(DEVICE), out=m)
    assert m.shape == (2, 4)


def test_reductions() -> None:
    x = torch.randn(3, 4, 5)
    d = x.to(DEVICE)
    assert_close(d.sum(), x.sum())
    assert_close(d.sum(dim=1), x.sum(dim=1))
    assert_close(d.sum(dim=(0, 2), keepdim=True), x.sum(dim=(0, 2), keepdim=True))
    assert_close(d.mean(dim=-1), x.mean(dim=-1))
    i = torch.randint(0, 10, (4, 4))
    assert_close(i.to(DEVICE).sum(0), i.sum(0))  # int64 result
    assert_close((i > 5).to(DEVICE).sum(), (i > 5).sum())


def test_matmul() -> None:
    a, b = torch.randn(7, 5), torch.randn(5, 3)
    assert_close(torch.mm(a.to(DEVICE), b.to(DEVICE)), a @ b, rtol=1e-4, atol=1e-5)
    assert_close(a.to(DEVICE).t().t() @ b.t().to(DEVICE).t(), a @ b, rtol=1e-4, atol=1e-5)
    lin = torch.nn.Linear(5, 3)
    expected = lin(a)
    assert_close(lin.to(DEVICE)(a.to(DEVICE)), expected, rtol=1e-4, atol=1e-5)


def test_kernel_errors_surface_as_python_exceptions() -> None:
    with pytest.raises(RuntimeError, match=r"reduction dim|size|shape"):
        torch.mm(torch.ones(2, 3, device=DEVICE), torch.ones(2, 3, device=DEVICE))
