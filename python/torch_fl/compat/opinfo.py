"""The OpInfo runner: PyTorch's OpInfo database, which OpInfos describe an operator, and their samples.

:class:`_OpInfoRunner` runs each sample input of an OpInfo on the CPU and on the
device, compares the results and, for differentiable OpInfos, the gradients of a
random-weighted sum of the outputs; each sample records which operators it
dispatched on the device.
"""

from __future__ import annotations

import math
import sys
import time
import types
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .compare import _compare
from .names import _base, _overload, op_name

__all__ = ["OPINFO_ALIASES", "find_opinfos", "load_op_db"]

#: Table operators whose OpInfo does not share their name. ``*_backward``
#: operators map to their forward operator's OpInfos by themselves (their
#: kernels run in the autograd check).
OPINFO_ALIASES: dict[str, tuple[str, ...]] = {
    "convolution": ("nn.functional.conv2d", "nn.functional.conv1d"),
    "_native_batch_norm_legit_no_training": ("nn.functional.batch_norm",),
    "native_batch_norm": ("native_batch_norm", "nn.functional.batch_norm"),
    "max_pool2d_with_indices": ("nn.functional.max_pool2d",),
    "avg_pool2d": ("nn.functional.avg_pool2d",),
    "_adaptive_avg_pool2d": ("nn.functional.adaptive_avg_pool2d",),
    "_softmax": ("softmax",),
    "_log_softmax": ("log_softmax",),
    "nll_loss_forward": ("nn.functional.nll_loss",),
    "nll_loss2d_forward": ("nn.functional.nll_loss",),
    "nll_loss": ("nn.functional.nll_loss",),
    "nll_loss2d": ("nn.functional.nll_loss",),
    "embedding_dense": ("nn.functional.embedding",),
    "threshold": ("nn.functional.relu", "nn.functional.threshold"),
    "silu": ("nn.functional.silu",),
    "softplus": ("nn.functional.softplus",),
    "gelu": ("nn.functional.gelu",),
    "hardtanh": ("nn.functional.hardtanh",),
    "leaky_relu": ("nn.functional.leaky_relu",),
    "relu": ("nn.functional.relu",),
    "native_layer_norm": ("native_layer_norm", "nn.functional.layer_norm"),
    "linalg_vector_norm": ("linalg.vector_norm",),
    # Operators the vision models added. "name.variant" picks one variant of an OpInfo.
    "hardsigmoid": ("nn.functional.hardsigmoid",),
    "log_sigmoid_forward": ("nn.functional.logsigmoid",),
    "smooth_l1_loss": ("nn.functional.smooth_l1_loss",),
    "upsample_bilinear2d": ("nn.functional.upsample_bilinear", "nn.functional.interpolate.bilinear"),
    "upsample_nearest2d": ("nn.functional.upsample_nearest", "nn.functional.interpolate.nearest"),
    "index": ("__getitem__",),
    "_index_put_impl_": ("index_put",),
    # Operators the language models added.
    "sort": ("sort", "argsort", "msort"),
    "gather": ("gather", "take_along_dim"),
    "flip": ("flip", "fliplr", "flipud"),
    "pow": ("pow", "__rpow__"),
}


def load_op_db() -> list[Any]:
    """PyTorch's OpInfo database.

    ``torch.testing._internal`` imports ``expecttest`` for its test-case class
    only; where that test dependency is missing, a stand-in is installed so the
    database still loads. The import freezes ``torch.backends`` flags (a test
    suite setting); they are unfrozen again afterwards.
    """
    try:
        import expecttest  # noqa: F401
    except ImportError:
        import unittest

        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase  # type: ignore[attr-defined]
        stub.ACCEPT = False  # type: ignore[attr-defined]
        sys.modules["expecttest"] = stub
    flag = "__allow_nonbracketed_mutation_flag"
    before = getattr(torch.backends, flag, True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    setattr(torch.backends, flag, before)
    return list(op_db)


def _opinfo_label(opinfo: Any) -> str:
    name: str = opinfo.name
    return name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def find_opinfos(table_op: str, op_db: Sequence[Any]) -> list[tuple[Any, str]]:
    """The OpInfos that exercise ``table_op``, each with the variant to run (``"function"`` or ``"inplace"``)."""
    base = _base(table_op)
    by_name: dict[str, list[Any]] = {}
    for info in op_db:
        for key in {info.name, info.aten_name, _opinfo_label(info)}:
            if key:
                by_name.setdefault(key, []).append(info)

    def lookup(name: str) -> list[Any]:
        found: list[Any] = []
        for alias in (name, *OPINFO_ALIASES.get(name, ())):
            found += [i for i in by_name.get(alias, []) if i not in found]
        return found

    forward = base
    for suffix in ("_backward_data", "_backward"):
        if base.endswith(suffix):
            forward = base[: -len(suffix)]
            break
    found = lookup(forward)
    if found:
        return [(i, "function") for i in found]
    if forward.endswith("_"):
        return [(i, "inplace") for i in lookup(forward[:-1]) if i.inplace_variant is not None]
    return []


# --- running samples ------------------------------------------------------------


class _Recorder(TorchDispatchMode):
    """Records the operators dispatched while it is active (also on autograd threads)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call] # TorchDispatchMode's __init__ is unannotated
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.add(op_name(func))
        return func(*args, **(kwargs or {}))


@dataclass
class _Sample:
    kind: str
    description: str
    outcome: str  # "passed", "failed", "skipped"
    dispatched: frozenset[str]
    error: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0


def _describe(value: Any, limit: int = 300) -> str:
    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            shape = "x".join(str(s) for s in v.shape) or "scalar"
            grad = ", grad" if v.requires_grad else ""
            return f"Tensor[{shape}, {str(v.dtype).replace('torch.', '')}{grad}]"
        if isinstance(v, (list, tuple)):
            inner = ", ".join(one(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner})"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}={one(x)}" for k, x in v.items()) + "}"
        return repr(v)

    text = one(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sample_description(sample: Any) -> str:
    parts = [_describe(sample.input)]
    parts += [_describe(a) for a in sample.args]
    parts += [f"{k}={_describe(v)}" for k, v in sample.kwargs.items()]
    name = f"{sample.name}: " if getattr(sample, "name", "") else ""
    return _describe_join(name, parts)


def _describe_join(prefix: str, parts: list[str], limit: int = 400) -> str:
    text = prefix + "(" + ", ".join(parts) + ")"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _numel(value: Any) -> int:
    leaves, _ = tree_flatten(value)
    return sum(t.numel() for t in leaves if isinstance(t, torch.Tensor))


def _copy_to(value: Any, device: str) -> Any:
    def move(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            moved = t.detach().to(device, copy=True)
            return moved.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else moved
        return t

    return tree_map(move, value)


def _grad_inputs(args: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(args)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]


def _weighted_sum(outputs: Any, seed: int) -> torch.Tensor | None:
    gen = torch.Generator().manual_seed(seed)
    total: torch.Tensor | None = None
    leaves, _ = tree_flatten(outputs)
    for out in leaves:
        if not isinstance(out, torch.Tensor) or not out.requires_grad or not out.is_floating_point():
            continue
        weights = torch.rand(out.shape, generator=gen, dtype=out.dtype).to(out.device)
        term = (out * weights).sum()
        total = term if total is None else total + term
    return total


_KNOWN = "PyTorch's OpInfo marks this operator's device-vs-CPU comparison as an expected failure"


def _is_inplace(variant: str) -> bool:
    return variant == "inplace" or (variant.startswith("overload:") and _base(variant[9:]).endswith("_"))


def _variant_fn(opinfo: Any, variant: str) -> Callable[..., Any]:
    if variant.startswith("overload:"):
        name = variant[len("overload:") :]
        packet = getattr(torch.ops.aten, _base(name))
        return _scalar_args(getattr(packet, _overload(name) or "default"))
    fn: Callable[..., Any] = opinfo.inplace_variant if variant == "inplace" else opinfo.op
    return fn


def _is_scalar_type(type_name: str) -> bool:
    return ("Scalar" in type_name or "number" in type_name) and "Tensor" not in type_name


def _scalar_args(overload: Any) -> Callable[..., Any]:
    """Call ``overload`` with one-element tensors passed as numbers where its schema takes a ``Scalar``."""
    scalar = [_is_scalar_type(str(a.type)) for a in overload._schema.arguments]
    names = {a.name for a, s in zip(overload._schema.arguments, scalar) if s}

    def number(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return value.item()
        return value

    def call(*args: Any, **kwargs: Any) -> Any:
        args = tuple(number(a) if i < len(scalar) and scalar[i] else a for i, a in enumerate(args))
        kwargs = {k: number(v) if k in names else v for k, v in kwargs.items()}
        return overload(*args, **kwargs)

    return call


def _known_cpu_mismatch(opinfo: Any, dtype: torch.dtype) -> bool:
    """Whether PyTorch's own ``test_compare_cpu`` expects this OpInfo's device results to differ from the CPU's."""
    import unittest

    for info in getattr(opinfo, "decorators", ()) or ():
        if getattr(info, "test_name", None) != "test_compare_cpu":
            continue
        if info.dtypes is not None and dtype not in info.dtypes:
            continue
        for decorator in info.decorators:
            if decorator is unittest.expectedFailure or "skip" in getattr(decorator, "__name__", "").lower():
                return True
    return False


class _OpInfoRunner:
    """Runs OpInfo samples on the CPU and on the device; caches results per OpInfo, variant and dtype."""

    def __init__(
        self,
        device: str,
        *,
        max_samples: int,
        max_numel: int,
        time_budget_s: float,
        autograd: bool,
    ) -> None:
        self.device = device
        self.max_samples = max_samples
        self.max_numel = max_numel
        self.time_budget_s = time_budget_s
        self.autograd = autograd
        self.cache: dict[tuple[int, str, torch.dtype], tuple[list[_Sample], bool]] = {}

    def run(self, opinfo: Any, variant: str, dtype: torch.dtype) -> tuple[list[_Sample], bool]:
        key = (id(opinfo), variant, dtype)
        if key not in self.cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    self.cache[key] = self._run(opinfo, variant, dtype)
                except Exception as err:  # a bad OpInfo never aborts the run
                    desc = f"sample generation: {type(err).__name__}"
                    self.cache[key] = ([_Sample("forward", desc, "skipped", frozenset(), str(err))], False)
        return self.cache[key]

    def _supports(self, opinfo: Any, dtype: torch.dtype) -> bool:
        try:
            return dtype in opinfo.supported_dtypes("cpu")
        except Exception:
            return False

    def _run(self, opinfo: Any, variant: str, dtype: torch.dtype) -> tuple[list[_Sample], bool]:
        if not self._supports(opinfo, dtype):
            return [], False
        fn = _variant_fn(opinfo, variant)
        grad = (
            self.autograd
            and (variant == "function" or (variant.startswith("overload:") and not _is_inplace(variant)))
            and opinfo.supports_autograd
            and (dtype.is_floating_point or dtype.is_complex)
        )
        known = _known_cpu_mismatch(opinfo, dtype)
        results: list[_Sample] = []
        start = time.monotonic()
        torch.manual_seed(0)
        samples: Iterator[Any] = iter(opinfo.sample_inputs("cpu", dtype, requires_grad=grad))
        taken = examined = 0
        # Samples the CPU itself rejects (an overload's schema does not bind)
        # do not count, up to a few times the budget.
        while taken < self.max_samples and examined < 8 * self.max_samples:
            if time.monotonic() - start > self.time_budget_s:
                return results, True
            try:
                sample = next(samples)
            except StopIteration:
                break
            if _is_inplace(variant) and getattr(sample, "broadcasts_input", False):
                continue
            if _numel((sample.input, sample.args, sample.kwargs)) > self.max_numel:
                continue
            examined += 1
            desc = _sample_description(sample)
            forward = self._forward(fn, sample, desc)
            if forward.outcome == "skipped" and forward.error.startswith("cpu:"):
                results.append(forward)
                continue
            taken += 1
            if forward.outcome == "failed" and known:
                forward.outcome = "skipped"
                forward.error = f"{_KNOWN}: {forward.error}"
            results.append(forward)
            if grad and _grad_inputs((sample.input, sample.args, sample.kwargs)):
                results.append(self._backward(fn, sample, desc, seed=taken))
        return results, False

    def _call(self, fn: Callable[..., Any], sample: Any, device: str, recorder: _Recorder | None) -> tuple[Any, Any]:
        inputs = _copy_to((sample.input, sample.args, sample.kwargs), device)
        inp, args, kwargs = inputs
        if recorder is None:
            return fn(inp, *args, **kwargs), inputs
        with recorder:
            return fn(inp, *args, **kwargs), inputs

    def _forward(self, fn: Callable[..., Any], sample: Any, desc: str) -> _Sample:
        try:
            with torch.no_grad():
                expected, _ = self._call(fn, sample, "cpu", None)
        except Exception as err:
            return _Sample("forward", desc, "skipped", frozenset(), f"cpu: {type(err).__name__}: {err}")
        recorder = _Recorder()
        try:
            with torch.no_grad():
                actual, _ = self._call(fn, sample, self.device, recorder)
            actual = _copy_to(actual, "cpu")
        except Exception as err:
            msg = f"raised on the device only: {type(err).__name__}: {err}"
            return _Sample("forward", desc, "failed", frozenset(recorder.ops), msg, math.inf, math.inf)
        error, max_abs, max_rel = _compare(actual, expected)
        outcome = "failed" if error else "passed"
        return _Sample("forward", desc, outcome, frozenset(recorder.ops), error or "", max_abs, max_rel)

    def _gradients(
        self, fn: Callable[..., Any], sample: Any, device: str, seed: int, recorder: _Recorder | None
    ) -> list[Any] | None:
        outputs, inputs = self._call(fn, sample, device, recorder)
        if sample.output_process_fn_grad is not None:
            outputs = sample.output_process_fn_grad(outputs)
        loss = _weighted_sum(outputs, seed)
        if loss is None:
            return None
        wrt = _grad_inputs(inputs)
        if recorder is None:
            grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        else:
            with recorder:
                grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        return [None if g is None else g.detach().cpu() for g in grads]

    def _backward(self, fn: Callable[..., Any], sample: Any, desc: str, seed: int) -> _Sample:
        try:
            expected = self._gradients(fn, sample, "cpu", seed, None)
        except Exception as err:
            return _Sample("autograd", desc, "skipped", frozenset(), f"cpu: {type(err).__name__}: {err}")
        if expected is None:
            return _Sample("autograd", desc, "skipped", frozenset(), "no differentiable output")
        recorder = _Recorder()
        try:
            actual = self._gradients(fn, sample, self.device, seed, recorder)
        except Exception as err:
            msg = f"backward raised on the device only: {type(err).__name__}: {err}"
            return _Sample("autograd", desc, "failed", frozenset(recorder.ops), msg, math.inf, math.inf)
        error, max_abs, max_rel = _compare(actual, expected)
        if error:
            error = "gradients differ: " + error
        outcome = "failed" if error else "passed"
        return _Sample("autograd", desc, outcome, frozenset(recorder.ops), error or "", max_abs, max_rel)
