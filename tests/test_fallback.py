"""Operators the plugin lacks: CPU fallback (default) or an error, counted.

The simulated plugin serves what training needs; the special functions
used here (``lgamma``, ``cosh``, ``sinh``, ``asinh``) are ones it does not
implement.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

import torch_fl

from .conftest import DEVICE, assert_close, assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


@pytest.fixture
def counts() -> Iterator[None]:
    torch_fl.reset_fallback_stats()
    yield
    torch_fl.set_fallback_mode("cpu")


def test_a_missing_operator_runs_on_the_cpu_and_warns_once(counts) -> None:
    x = torch.randn(5)
    message = r"'aten::cosh(\.out)?' has no 'sim' kernel.*TORCH_FL_FALLBACK=error"
    with pytest.warns(UserWarning, match=message) as record:
        y = torch.cosh(x.to(DEVICE))
        torch.cosh(x.to(DEVICE))
    assert len([w for w in record if "aten::cosh" in str(w.message)]) == 1, "one warning per operator"
    assert_close(y, torch.cosh(x))
    stats = torch_fl.fallback_stats()
    assert sum(n for op, n in stats.items() if op.split(".")[0] == "cosh") == 2, stats


def test_in_place_fallback_on_a_view_writes_through_to_the_base(counts) -> None:
    base = torch.zeros(2, 4).to(DEVICE)
    view = base[:, 1:3]  # a strided view
    with pytest.warns(UserWarning, match="cosh"):
        returned = view.cosh_()
    assert returned.data_ptr() == view.data_ptr()
    expected = torch.zeros(2, 4)
    expected[:, 1:3] = 1.0
    assert_close(base, expected)


def test_out_fallback(counts) -> None:
    x = torch.rand(6) + 0.5
    out = torch.empty(6, device=DEVICE)
    with pytest.warns(UserWarning, match="aten::lgamma"):
        r = torch.lgamma(x.to(DEVICE), out=out)
    assert r is out
    assert_close(out, torch.lgamma(x))


def test_error_mode_names_the_operator_and_the_symbol_to_export(counts) -> None:
    torch_fl.set_fallback_mode("error")
    assert torch_fl.fallback_mode() == "error"
    x = torch.ones(3, device=DEVICE)
    with pytest.raises(NotImplementedError, match=r"aten::sinh.*torch_fl_op_sinh"):
        torch.sinh(x)
    with pytest.raises(NotImplementedError, match=r"torch_fl_op_asinh_"):
        x.asinh_()
    # Operators the plugin implements are unaffected.
    assert_close(x + x, torch.full((3,), 2.0))


def test_error_mode_from_the_environment() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            print(torch_fl.fallback_mode())
            try:
                torch.cosh(torch.ones(2, device="sim"))
            except NotImplementedError as e:
                print("raised", "torch_fl_op_cosh" in str(e))
            """,
            env={"TORCH_FL_FALLBACK": "error"},
        )
    )
    assert out.split() == ["error", "raised", "True"]


def test_unknown_fallback_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="'cpu' or 'error'"):
        torch_fl.set_fallback_mode("gpu")


def test_out_fallback_never_triggers_pytorchs_deprecated_resize_warning(counts) -> None:
    """mse_loss.out's CPU kernel resizes `out` through [3, 4] even when it has its final shape []."""
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(3, 4)
    da = a.detach().to(DEVICE).requires_grad_()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loss = torch.nn.functional.mse_loss(da, b.to(DEVICE))
        loss.backward()
    assert not [w for w in record if "was resized" in str(w.message)], [str(w.message) for w in record]
    assert "mse_loss.out" in torch_fl.fallback_stats()
    expected = torch.nn.functional.mse_loss(a, b)
    expected.backward()
    assert_close(loss, expected)
    assert_close(da.grad, a.grad)


def test_out_fallback_into_a_strided_or_wrongly_sized_out_keeps_pytorchs_semantics(counts) -> None:
    x = torch.rand(6) + 0.5
    strided = torch.zeros(6, 2, device=DEVICE)[:, 0]  # a view: results land in the base
    with pytest.warns(UserWarning, match="aten::lgamma"):
        r = torch.lgamma(x.to(DEVICE), out=strided)
    assert r is strided
    assert_close(strided._base[:, 0], torch.lgamma(x))
    assert_close(strided._base[:, 1], torch.zeros(6))
    wrong = torch.empty(3, device=DEVICE)  # PyTorch resizes it, with its deprecation warning
    with pytest.warns(UserWarning, match="was resized"):
        torch.lgamma(x.to(DEVICE), out=wrong)
    assert wrong.shape == (6,)
    assert_close(wrong, torch.lgamma(x))
