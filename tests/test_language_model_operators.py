"""The operators language models need, on the device, against the CPU: the cases PyTorch's OpInfo samples miss.

OpInfo conformance of every table operator runs in ``test_compat.py``, and
whole models train and generate in ``test_language_models.py``; this module
covers what OpInfo does not reach: dtypes and layouts the samples skip,
parallel paths of large inputs, duplicates and ties, data-dependent errors,
and the random operators (which cannot be compared with the CPU's values).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import torch_fl

from .conftest import DEVICE, assert_close

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime

BIG = 70_000  # above the kernels' threshold for multi-threaded work


@pytest.fixture(autouse=True)
def native_only():
    """Every operator here must run on the device: the CPU fallback raises."""
    before = torch_fl.fallback_mode()
    torch_fl.set_fallback_mode("error")
    try:
        yield
    finally:
        torch_fl.set_fallback_mode(before)


def dev(t: torch.Tensor) -> torch.Tensor:
    return t.to(DEVICE)


# -- positions: arange, tril/triu, flip -------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float64, torch.bfloat16])
def test_arange(dtype: torch.dtype) -> None:
    for args in [(10,), (2, 11, 3), (5, -7, -2), (0, 1, 0.1) if dtype.is_floating_point else (0, 9, 4)]:
        assert_close(torch.arange(*args, dtype=dtype, device=DEVICE), torch.arange(*args, dtype=dtype))
    assert_close(torch.arange(BIG, device=DEVICE), torch.arange(BIG))
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        torch.arange(0, 5, 0, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int64])
@pytest.mark.parametrize("diagonal", [-2, 0, 1, 5])
def test_tril_and_triu(dtype: torch.dtype, diagonal: int) -> None:
    x = (torch.randn(3, 5, 7) * 3).to(dtype)
    for op in (torch.tril, torch.triu):
        assert_close(op(dev(x), diagonal), op(x, diagonal))
        assert_close(op(dev(x).transpose(1, 2), diagonal), op(x.transpose(1, 2), diagonal))
    y = dev(x)
    y.tril_(diagonal)
    assert_close(y, x.tril(diagonal))


def test_causal_masks_built_on_the_device() -> None:
    n = 300  # large enough for the parallel path
    assert_close(torch.ones(n, n, device=DEVICE).tril(), torch.ones(n, n).tril())
    mask = torch.triu(torch.full((n, n), float("-inf"), device=DEVICE), diagonal=1)
    assert_close(mask, torch.triu(torch.full((n, n), float("-inf")), diagonal=1))


def test_flip() -> None:
    x = torch.randn(4, 5, 6)
    for dims in [(0,), (1, 2), (-1,), (0, 1, 2)]:
        assert_close(dev(x).flip(dims), x.flip(dims))
        assert_close(dev(x).transpose(0, 2).flip(dims), x.transpose(0, 2).flip(dims))
    assert_close(dev(torch.arange(BIG)).flip(0), torch.arange(BIG).flip(0))


# -- sin, cos, pow ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_sin_and_cos(dtype: torch.dtype) -> None:
    top = 6e4 if dtype == torch.float16 else 3e5  # past the fast path's range (1e5), inside the dtype's
    x = torch.cat([torch.randn(1000) * 10, torch.linspace(-top, top, 999), torch.tensor([0.0, -0.0, math.pi])])
    x = x.to(dtype)
    # float32: within one unit in the last place of the CPU's SLEEF results.
    tol = {"rtol": 1.3e-6, "atol": 1e-6} if dtype == torch.float32 else {}
    assert_close(torch.sin(dev(x)), torch.sin(x), **tol)
    assert_close(torch.cos(dev(x)), torch.cos(x), **tol)
    assert_close(torch.sin(dev(torch.arange(5))), torch.sin(torch.arange(5)))  # integers promote to float


def test_rotary_frequencies_match_the_cpu() -> None:
    inv = 1.0 / (10000.0 ** (torch.arange(0, 64, 2).float() / 64))
    inv_dev = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, device=DEVICE).float() / 64))
    assert_close(inv_dev, inv, rtol=2e-7, atol=0)
    freqs = torch.outer(torch.arange(4096).float(), inv)
    assert_close(torch.outer(torch.arange(4096, device=DEVICE).float(), inv_dev).cos(), freqs.cos(), atol=2e-6, rtol=0)


def test_pow_with_tensor_exponents() -> None:
    e = torch.tensor([-2, 0, 1, 5, 62])
    assert_close(2 ** dev(e), 2**e)  # int64: exact, negative exponents give 0
    assert_close(torch.pow(dev(torch.tensor([3, -1, 0])), dev(torch.tensor([4, -3, 0]))), torch.tensor([81, -1, 1]))
    x, y = torch.rand(50) * 3, torch.randn(50)
    assert_close(torch.pow(dev(x), dev(y)), torch.pow(x, y), rtol=2e-7, atol=1e-7)
    assert_close(1.5 ** dev(y.double()), 1.5 ** y.double())


# -- rounding divisions ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.float32, torch.float64, torch.bfloat16])
def test_floor_divide_div_modes_and_remainder(dtype: torch.dtype) -> None:
    a = torch.tensor([-7, -6, -1, 0, 1, 5, 7, 9, 100]).to(dtype)
    b = torch.tensor([2, -3, 4, 5, -2, 3, -7, 4, 9]).to(dtype)
    da, db = dev(a), dev(b)
    assert_close(da // db, a // b)
    assert_close(da // 3, a // 3)
    assert_close(da % db, a % b)
    assert_close(da % -4, a % -4)
    for mode in ("trunc", "floor", None):
        assert_close(torch.div(da, db, rounding_mode=mode), torch.div(a, b, rounding_mode=mode))
    c = da.clone()
    c //= db
    assert_close(c, a // b)


def test_float_division_edge_cases() -> None:
    a = torch.tensor([1.0, -1.0, 0.0, float("inf"), float("nan"), 7.5, -7.5, 1e-30])
    b = torch.tensor([0.0, 0.0, 0.0, 2.0, 1.0, -2.0, 2.0, -1e30])
    assert_close(dev(a) // dev(b), a // b, equal_nan=True)
    assert_close(dev(a) % dev(b), a % b, equal_nan=True)
    assert_close(
        torch.div(dev(a), dev(b), rounding_mode="trunc"), torch.div(a, b, rounding_mode="trunc"), equal_nan=True
    )


def test_integer_division_by_zero_raises() -> None:
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        dev(torch.tensor([1, 2])) // 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        (dev(torch.tensor([1, 2])) % dev(torch.tensor([1, 0]))).cpu()


# -- scans -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool])
def test_cumsum(dtype: torch.dtype) -> None:
    x = (torch.randn(6, 7, 8) * 4).to(dtype)
    for dim in (0, 1, 2, -1):
        assert_close(torch.cumsum(dev(x), dim), torch.cumsum(x, dim))
    assert_close(torch.cumsum(dev(x), 1, dtype=torch.float64), torch.cumsum(x, 1, dtype=torch.float64))


@pytest.mark.parametrize("shape,dim", [((BIG,), 0), ((4, BIG // 4), 1), ((3, 5000, 8), 1), ((2, 9, 4000), 1)])
def test_cumsum_and_cumprod_of_large_tensors(shape: tuple[int, ...], dim: int) -> None:
    x = torch.rand(shape)
    assert_close(torch.cumsum(dev(x), dim), torch.cumsum(x, dim))
    y = 1 + torch.rand(shape) * 1e-4
    assert_close(torch.cumprod(dev(y), dim), torch.cumprod(y, dim))
    i = torch.randint(-5, 5, shape)
    assert_close(torch.cumsum(dev(i), dim), torch.cumsum(i, dim))


# -- sort and topk -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_sort_is_stable_with_nan_last(dtype: torch.dtype) -> None:
    x = torch.randint(0, 4, (5, 40)).to(dtype)
    if dtype.is_floating_point:
        x[0, ::7] = float("nan")
        x[1, ::5] = -0.0
    for descending in (False, True):
        for dim in (0, 1):
            v, i = torch.sort(dev(x), dim=dim, descending=descending, stable=True)
            ev, ei = torch.sort(x, dim=dim, descending=descending, stable=True)
            assert_close(v, ev, equal_nan=True)
            assert_close(i, ei)


def test_sort_and_argsort_of_a_long_row() -> None:
    x = torch.randn(BIG)  # float32: a few values repeat, so compare indices stably
    v, i = torch.sort(dev(x))
    assert_close(v, torch.sort(x).values)
    assert_close(i, torch.sort(x, stable=True).indices)
    order = torch.argsort(dev(x), descending=True)
    assert_close(order, torch.argsort(x, descending=True, stable=True))


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest: bool) -> None:
    # Distinct values: among 8,000 random floats two are often equal, and
    # the order of equal values' indices is not PyTorch's contract (the
    # tie case below is, with the simulator's rule).
    x = torch.randperm(8 * 1000).to(torch.float32).reshape(8, 1000) / 8000 - 0.5
    for k, dim in [(1, -1), (5, 1), (1000, 1), (3, 0)]:
        v, i = torch.topk(dev(x), k, dim=dim, largest=largest)
        ev, ei = torch.topk(x, k, dim=dim, largest=largest)
        assert_close(v, ev)
        assert_close(i, ei)
    ties = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    v, i = torch.topk(dev(ties), 2)
    assert i.cpu().tolist() == [[1, 2]], "equal values: the lower index first"
    with pytest.raises(RuntimeError, match="k not in range for dimension"):
        torch.topk(dev(x), 1001)


# -- isin ---------------------------------------------------------------------------------------


def test_isin() -> None:
    x = torch.randint(0, 50, (6, 30))
    test = torch.tensor([3, 7, 7, 49, 100])
    assert_close(torch.isin(dev(x), dev(test)), torch.isin(x, test))
    assert_close(torch.isin(dev(x), dev(test), invert=True), torch.isin(x, test, invert=True))
    assert_close(torch.isin(dev(x), 7), torch.isin(x, 7))
    f = torch.tensor([0.0, -0.0, float("nan"), 1.5, 3.0])
    tf = torch.tensor([-0.0, float("nan"), 3])
    assert_close(torch.isin(dev(f), dev(tf)), torch.isin(f, tf))
    assert_close(torch.isin(dev(x.to(torch.int32)), dev(test.double() + 0.5)), torch.isin(x.int(), test.double() + 0.5))
    big = torch.randint(0, 1000, (BIG,))
    assert_close(torch.isin(dev(big), dev(test)), torch.isin(big, test))


# -- gather, scatter, scatter_add ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_gather_and_scatter(dtype: torch.dtype) -> None:
    x = (torch.randn(5, 6, 7) * 5).to(dtype)
    for dim in (0, 1, 2):
        idx = torch.randint(0, x.shape[dim], (4, 5, 6))
        assert_close(torch.gather(dev(x), dim, dev(idx)), torch.gather(x, dim, idx))
        src = (torch.randn(4, 5, 6) * 5).to(dtype)
        assert_close(torch.scatter(dev(x), dim, dev(idx), dev(src)), torch.scatter(x, dim, idx, src))
        assert_close(torch.scatter(dev(x), dim, dev(idx), 1), torch.scatter(x, dim, idx, 1))
        # Duplicate indices add in index order, as on the CPU: bit-identical.
        assert_close(torch.scatter_add(dev(x), dim, dev(idx), dev(src)), torch.scatter_add(x, dim, idx, src))


def test_scatter_in_place_and_on_strided_tensors() -> None:
    x = torch.randn(6, 8)
    idx = torch.randint(0, 8, (6, 3))
    y = dev(x).t().contiguous().t()  # column-major
    y.scatter_(1, dev(idx), 2.0)
    assert_close(y, x.scatter(1, idx, 2.0))
    z = torch.zeros(300, 400)
    i = torch.randint(0, 300, (300, 400))
    s = torch.rand(300, 400)
    assert_close(dev(z).scatter_add_(0, dev(i), dev(s)), z.scatter_add(0, i, s))


def test_gather_rejects_out_of_range_indices() -> None:
    with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 1 with size 5"):
        torch.gather(dev(torch.zeros(2, 5)), 1, dev(torch.tensor([[0], [5]]))).cpu()


# -- advanced indexing --------------------------------------------------------------------------------


def test_indexing_with_tensors() -> None:
    x = torch.randn(5, 6, 7)
    d = dev(x)
    i, j = torch.tensor([0, 4, -1, 2]), torch.tensor([[1], [5]])
    assert_close(d[dev(i)], x[i])
    assert_close(d[:, [-1]], x[:, [-1]])
    assert_close(d[dev(i), :, dev(i)], x[i, :, i])  # not adjacent: the broadcast dimensions come first
    assert_close(d[:, dev(j), dev(i[:2])], x[:, j, i[:2]])  # index shapes broadcast
    assert_close(d.transpose(0, 2)[dev(i)], x.transpose(0, 2)[i])
    assert_close(d[dev(i.int())], x[i.int()])
    rows = torch.randint(0, 300, (BIG // 100,))
    table = torch.randn(300, 128)
    assert_close(dev(table)[dev(rows)], table[rows])


def test_indexing_with_boolean_masks() -> None:
    # PyTorch sizes a masked result with nonzero on the device, then the
    # plugin's index kernel expands the mask itself. nonzero is a kernel the
    # vision models need: until the plugin has it, it alone may fall back.
    x = torch.randn(5, 6, 7)
    mask = torch.rand(5, 6) > 0.5
    torch_fl.set_fallback_mode("cpu")
    torch_fl.reset_fallback_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning
        assert_close(dev(x)[dev(mask)], x[mask])
        assert_close(dev(x)[2:, dev(mask[0])], x[2:, mask[0]])
        assert_close(dev(x)[dev(mask), dev(torch.tensor([1]))], x[mask, torch.tensor([1])])
    assert set(torch_fl.fallback_stats()) <= {"nonzero"}


def test_cpu_index_tensors_index_device_tensors_as_on_cuda() -> None:
    # Advanced indexing copies CPU indices to the device (PyTorch's
    # AdvancedIndex does so for CUDA); gather does not accept them, on CUDA
    # either.
    x = torch.randn(5, 3)
    assert_close(dev(x)[torch.tensor([0, 4, -1])], x[torch.tensor([0, 4, -1])])
    assert_close(dev(x)[torch.tensor(2), torch.tensor([0, 2])], x[torch.tensor(2), torch.tensor([0, 2])])
    y = dev(torch.zeros(5, 3))
    y[torch.tensor([1, 3])] = 2.0
    y.index_put_((torch.tensor([1, 1]),), dev(torch.ones(3)), accumulate=True)
    expected = torch.zeros(5, 3)
    expected[torch.tensor([1, 3])] = 2.0
    expected[1] += 2
    assert_close(y, expected)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.gather(dev(x), 0, torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_fill_is_composed_on_the_device(dim: int, dtype: torch.dtype) -> None:
    # torch 2.15 sends `x[index] = scalar` here (torch_fl.composites).
    x = (torch.randn(5, 4) * 10).to(dtype)
    idx = torch.tensor([1, 3, 1])
    assert_close(dev(x).index_fill_(dim, dev(idx), 7), x.clone().index_fill_(dim, idx, 7))
    value = torch.tensor(2, dtype=dtype)
    assert_close(dev(x).index_fill_(dim, dev(idx), dev(value)), x.clone().index_fill_(dim, idx, value))


def test_index_put_with_duplicates_accumulates_in_order() -> None:
    x = torch.zeros(10, 3)
    idx = torch.tensor([1, 4, 1, 1, 9, -1])
    v = torch.randn(6, 3)
    assert_close(dev(x).index_put_((dev(idx),), dev(v), accumulate=True), x.index_put((idx,), v, accumulate=True))
    y = dev(torch.zeros(10, 3))
    y[dev(torch.tensor([2, 5]))] = 7.0
    assert_close(y, x.index_put((torch.tensor([2, 5]),), torch.tensor(7.0)))
    m = torch.rand(10, 3) > 0.5
    z = dev(torch.zeros(10, 3))
    z[dev(m)] = dev(torch.arange(int(m.sum())).float())
    expected = torch.zeros(10, 3)
    expected[m] = torch.arange(int(m.sum())).float()
    assert_close(z, expected)


def test_indexing_backward_accumulates_like_the_cpu() -> None:
    x = torch.randn(8, 4, requires_grad=True)
    idx = torch.tensor([[0, 3, 3], [7, 0, 3]])
    (x[idx] * torch.arange(24.0).reshape(2, 3, 4)).sum().backward()
    xd = dev(x.detach()).requires_grad_()
    (xd[dev(idx)] * dev(torch.arange(24.0).reshape(2, 3, 4))).sum().backward()
    assert_close(xd.grad, x.grad)


def test_out_of_range_index_raises() -> None:
    with pytest.raises(RuntimeError, match="index 6 is out of bounds for dimension 0 with size 5"):
        dev(torch.zeros(5))[dev(torch.tensor([1, 6]))].cpu()


# -- random sampling -------------------------------------------------------------------------------------


def test_multinomial_follows_the_distribution() -> None:
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    g = torch.Generator(DEVICE).manual_seed(0)
    draws = torch.multinomial(dev(probs), 20_000, replacement=True, generator=g).cpu()
    freq = torch.bincount(draws, minlength=4).double() / draws.numel()
    # Binomial standard deviation at n = 20000 is at most 0.0035.
    torch.testing.assert_close(freq, probs.double(), atol=0.015, rtol=0)
    rows = dev(torch.tensor([[1.0, 2.0, 0.0, 4.0], [0.0, 0.0, 1.0, 1.0]]).repeat(500, 1))
    single = torch.multinomial(rows, 1, generator=g).cpu()
    assert not (single == 2).reshape(500, 2)[:, 0].any(), "zero-probability categories are never drawn"
    first = single.reshape(500, 2)[:, 0]
    torch.testing.assert_close(
        torch.bincount(first, minlength=4).double() / 500, torch.tensor([1.0, 2, 0, 4]).double() / 7, atol=0.07, rtol=0
    )


def test_multinomial_without_replacement_draws_distinct_categories() -> None:
    p = dev(torch.rand(64, 50) + 0.01)
    draws = torch.multinomial(p, 50, generator=torch.Generator(DEVICE).manual_seed(1)).cpu()
    assert all(len(set(row.tolist())) == 50 for row in draws)
    sparse = dev(torch.tensor([0.0, 1.0, 0.0, 3.0]))
    assert sorted(torch.multinomial(sparse, 2).cpu().tolist()) == [1, 3]


def test_multinomial_is_seeded_by_the_device_generator() -> None:
    p = dev(torch.rand(3, 100))
    g1, g2 = torch.Generator(DEVICE).manual_seed(7), torch.Generator(DEVICE).manual_seed(7)
    assert torch.equal(torch.multinomial(p, 5, generator=g1).cpu(), torch.multinomial(p, 5, generator=g2).cpu())
    torch.manual_seed(3)
    a = torch.multinomial(p, 5, replacement=True).cpu()
    b = torch.multinomial(p, 5, replacement=True).cpu()
    torch.manual_seed(3)
    assert torch.equal(torch.multinomial(p, 5, replacement=True).cpu(), a)
    assert not torch.equal(a, b), "consecutive calls draw fresh numbers"


def test_multinomial_rejects_invalid_distributions() -> None:
    with pytest.raises(RuntimeError, match="probability tensor contains either `inf`, `nan` or element < 0"):
        torch.multinomial(dev(torch.tensor([0.5, -0.1])), 1).cpu()
    with pytest.raises(RuntimeError, match="sum of probabilities <= 0"):
        torch.multinomial(dev(torch.zeros(3)), 1).cpu()
    with pytest.raises(RuntimeError, match=r"cannot sample n_sample > prob_dist\.size"):
        torch.multinomial(dev(torch.ones(3)), 4)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_randperm(dtype: torch.dtype) -> None:
    for n in (1, 10, BIG):
        p = torch.randperm(n, device=DEVICE, dtype=dtype).cpu()
        assert p.dtype == dtype and torch.equal(p.sort().values, torch.arange(n, dtype=dtype))
    g = torch.Generator(DEVICE)
    a = torch.randperm(100, device=DEVICE, generator=g.manual_seed(4)).cpu()
    b = torch.randperm(100, device=DEVICE, generator=g.manual_seed(4)).cpu()
    assert torch.equal(a, b) and not torch.equal(a, torch.arange(100))


# -- fused Adam/AdamW -----------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"amsgrad": True}, {"maximize": True, "weight_decay": 0.0}])
@pytest.mark.parametrize("adamw", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_adam_matches_the_cpu(options: dict, adamw: bool, dtype: torch.dtype) -> None:
    cls = torch.optim.AdamW if adamw else torch.optim.Adam
    kwargs = {"lr": 1e-2, "weight_decay": 0.05, **options}
    params = [torch.randn(17, 5, dtype=dtype), torch.randn(BIG, dtype=dtype)]
    cpu = [p.clone().requires_grad_() for p in params]
    devp = [dev(p).requires_grad_() for p in params]
    opt_cpu, opt_dev = cls(cpu, fused=True, **kwargs), cls(devp, fused=True, **kwargs)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(cpu, grads, strict=True):
            p.grad = g.clone()
        for p, g in zip(devp, grads, strict=True):
            p.grad = dev(g)
        opt_cpu.step()
        opt_dev.step()
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-14}
    for a, b in zip(devp, cpu, strict=True):
        assert_close(a.detach(), b.detach(), **tol)


def test_fused_adamw_with_a_tensor_learning_rate_and_a_grad_scaler() -> None:
    model = torch.nn.Linear(8, 4).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-2), fused=True)
    scaler = torch.amp.GradScaler(DEVICE)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    for _ in range(2):
        opt.zero_grad()
        scaler.scale(model(dev(torch.randn(3, 8))).square().mean()).backward()
        scaler.step(opt)
        scaler.update()
    assert all(not torch.equal(p.detach().cpu(), b) for p, b in zip(model.parameters(), before, strict=True))
    # An inf gradient skips the step (found_inf), as on the CPU.
    opt.zero_grad()
    frozen = [p.detach().cpu().clone() for p in model.parameters()]
    scaler.scale(model(dev(torch.full((3, 8), float("inf")))).sum()).backward()
    scaler.step(opt)
    assert all(torch.equal(p.detach().cpu(), f) for p, f in zip(model.parameters(), frozen, strict=True))
