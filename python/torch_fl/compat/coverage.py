"""Model coverage: the operators standard models dispatch, and how the plugin serves them.

A ResNet-18 and the vision models of :mod:`.vision` (MobileNet-v3, DeepLabV3,
Faster R-CNN, ViT; when torchvision is installed), a Transformer encoder, an
LSTM, and GPT-, Llama- and BERT-style language models with a generation loop
(:mod:`~torch_fl.compat.lm_coverage`) are traced on the CPU (forward, and
backward where the output is differentiable), then run on the device; each
traced operator is served natively (a plugin kernel), fell back to the CPU
(:func:`torch_fl.fallback_stats`, the ground truth), or neither (views,
factories, composites).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..fallback import fallback_stats, reset_fallback_stats
from .compare import _errors
from .lm_coverage import lm_models
from .model import CoverageReport, ModelCoverage, _first_line
from .names import _base, _served_natively, op_name
from .vision import vision_models

__all__ = ["run_coverage"]

#: A model to cover: its label, how to build it, and how to make its input.
_Model = tuple[str, Callable[[], torch.nn.Module], Callable[[], torch.Tensor]]


def _models() -> list[_Model]:
    models: list[_Model] = []
    try:
        import torchvision

        models.append(
            (
                "resnet18 (2x3x32x32, forward+backward)",
                lambda: torchvision.models.resnet18(weights=None, num_classes=10),
                lambda: torch.randn(2, 3, 32, 32),
            )
        )
        models += vision_models()
    except ImportError:
        pass

    def encoder() -> torch.nn.Module:
        layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    models.append(
        ("TransformerEncoder (2 layers, d_model 32, forward+backward)", encoder, lambda: torch.randn(2, 8, 32))
    )
    models.append(
        (
            "LSTM (hidden 32, forward+backward)",
            lambda: torch.nn.LSTM(input_size=16, hidden_size=32, batch_first=True),
            lambda: torch.randn(2, 5, 16),
        )
    )
    models += lm_models()
    return models


def _first_tensor(output: Any) -> torch.Tensor:
    leaves, _ = tree_flatten(output)
    return next(t for t in leaves if isinstance(t, torch.Tensor))


def _model_step(model: torch.nn.Module, data: torch.Tensor) -> torch.Tensor:
    out = _first_tensor(model(data))
    if out.requires_grad:  # generation loops are forward only
        out.sum().backward()
    return out.detach()


def run_coverage(device: str, table: Sequence[str]) -> CoverageReport:
    """Trace the standard models on the CPU and run them on the device; classify their operators."""
    report = CoverageReport()
    models = _models()
    if not any(name.startswith("resnet") for name, _, _ in models):
        report.skipped = "resnet18: torchvision is not installed"
    for name, make, data in models:
        cov = ModelCoverage(name)
        try:
            _trace_and_run(cov, make, data, device)
        except Exception as err:
            cov.error = _model_error(err)
        _classify(cov, table)
        report.models.append(cov)
    return report


def _trace_and_run(
    cov: ModelCoverage, make: Callable[[], torch.nn.Module], data: Callable[[], torch.Tensor], device: str
) -> None:
    """Record the operators one training step dispatches on the CPU, then run the step on the device."""
    torch.manual_seed(0)
    model, x = make(), data()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    recorder = _Counter()
    # CPU-only fused kernels (oneDNN RNNs) would hide the operators a device dispatches.
    with recorder, torch.backends.mkldnn.flags(enabled=False):
        expected = _model_step(model, x)
    cov.traced = dict(sorted(recorder.counts.items()))
    model.load_state_dict(state)
    model.zero_grad(set_to_none=True)
    model.to(device)
    reset_fallback_stats()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = _model_step(model, x.to(device))
    finally:
        cov.device_fallbacks = fallback_stats()
    cov.max_abs_error = _errors(actual.cpu(), expected)[0]


def _model_error(err: Exception) -> str:
    """Why a model did not run on the device; names the operator when it lacked a CPU kernel to fall back to."""
    error = f"{type(err).__name__}: {_first_line(str(err), 400)}"
    missing = re.search(r"Could not run '(?:aten::)?([\w.]+)' with arguments from the 'CPU' backend", str(err))
    if missing:
        return (
            f"on the device PyTorch dispatches {missing.group(1)}, which has no CPU kernel for the CPU "
            f"fallback to use: the plugin must implement it ({error})"
        )
    return error


def _classify(cov: ModelCoverage, table: Sequence[str]) -> None:
    """Sort the traced operators into fell back, native and other; add those that fell back only on the device."""
    fallen = {_base(op).rstrip("_") for op in cov.device_fallbacks}
    traced_bases = {_base(op).rstrip("_") for op in cov.traced}
    for op in cov.traced:
        if _base(op).rstrip("_") in fallen:
            cov.fallback.append(op)
        elif _served_natively(op, table):
            cov.native.append(op)
        else:
            cov.other.append(op)
    # Operators the device dispatched that the CPU trace did not show.
    cov.fallback += sorted(op for op in cov.device_fallbacks if _base(op).rstrip("_") not in traced_bases)


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call] # TorchDispatchMode's __init__ is unannotated
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = op_name(func)
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))
