"""Comparing a device's results with the CPU's: ``assert_close``'s verdict and the largest differences."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._pytree import tree_flatten


def _errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """Largest absolute and relative differences (NaNs in the same places are equal)."""
    if actual.shape != expected.shape or actual.numel() == 0:
        return 0.0, 0.0
    a = actual.detach().cpu().to(torch.float64) if not actual.is_complex() else actual.detach().cpu()
    e = expected.detach().to(torch.float64) if not expected.is_complex() else expected.detach()
    diff = (a - e).abs()
    same = (a == e) | (torch.isnan(a) & torch.isnan(e))
    diff = torch.where(same, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=math.inf)
    rel = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
    rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
    return float(diff.max()), float(rel.max())


def _compare(actual: Any, expected: Any) -> tuple[str | None, float, float]:
    """Compare a device result with the CPU's: (error message or None, max abs error, max rel error)."""
    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    if a_spec != e_spec:
        return f"result structure differs: device {a_spec}, cpu {e_spec}", math.inf, math.inf
    max_abs = max_rel = 0.0
    errors: list[str] = []
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        where = f"output {i}: " if len(a_leaves) > 1 else ""
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                errors.append(f"{where}device returned {type(a).__name__}, cpu a tensor")
                continue
            abs_err, rel_err = _errors(a, e)
            max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
            try:
                torch.testing.assert_close(a.detach().cpu(), e.detach(), equal_nan=True, check_device=False)
            except AssertionError as err:
                errors.append(where + str(err).strip())
        elif isinstance(e, float) and isinstance(a, (float, int)):
            if not (math.isclose(a, e, rel_tol=1.3e-6, abs_tol=1e-5) or (math.isnan(a) and math.isnan(e))):
                errors.append(f"{where}{a!r} != {e!r}")
                max_abs = max(max_abs, abs(a - e))
        elif a != e:
            errors.append(f"{where}{a!r} != {e!r}")
    return ("\n".join(errors) or None), max_abs, max_rel
