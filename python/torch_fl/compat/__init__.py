"""``torch_fl.test_compatibility``: check a plugin against PyTorch's CPU results.

Four checks, one report:

* **numerical conformance** — every ATen operator in the plugin's op table is
  matched to PyTorch's OpInfo database (``torch.testing._internal``); each
  sample input runs on the CPU and on the device and the results are compared
  with ``torch.testing.assert_close``'s tolerances for the dtype. Each sample
  records which operators it dispatched on the device, so a result counts for
  exactly the table operators the sample exercised;
* **autograd conformance** — for differentiable OpInfos, the gradients of a
  random-weighted sum of the outputs with respect to every tensor input,
  on the CPU and on the device (this is what exercises ``*_backward`` kernels);
* **coverage** — the ATen operators a ResNet-18, a Transformer encoder and an
  LSTM dispatch (forward and backward), which of them the plugin serves
  natively, and which fell back to the CPU when the models actually ran on the
  device (:func:`torch_fl.fallback_stats`, the ground truth);
* **integrity** — the ABI checks of ``torchfl-abi verify`` on the plugin file.

The report is a :class:`CompatReport`; ``report_dir`` receives ``compat.json``,
a self-contained ``compat.html`` and the terminal summary, ``compat.txt``.
``python -m torch_fl compat`` runs the same from the command line (exit 0:
passed, 1: a check failed, 3: the plugin could not be loaded).
"""

from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .. import _native, registration

__all__ = [
    "CheckResult",
    "CompatReport",
    "CoverageReport",
    "IntegrityReport",
    "ModelCoverage",
    "OpResult",
    "SampleFailure",
    "test_compatibility",
]

PathLike = Union[str, Path]

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
}

#: Random operators: the device's random stream differs from the CPU's, so
#: values cannot be compared with a CPU run.
RANDOM_OPS = frozenset({"uniform_", "normal_", "bernoulli_", "random_", "native_dropout", "exponential_"})


# --- report data ---------------------------------------------------------------


@dataclass
class SampleFailure:
    """One failing sample: what it was and how the device's result differed."""

    sample: str
    error: str
    kind: str = "forward"
    max_abs_error: float | None = None
    max_rel_error: float | None = None


@dataclass
class CheckResult:
    """The samples of one OpInfo, variant, dtype and kind (forward or autograd) that exercised one operator."""

    opinfo: str
    variant: str
    dtype: str
    kind: str
    samples_run: int = 0
    passed: int = 0
    skipped: int = 0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    failures: list[SampleFailure] = field(default_factory=list)
    timed_out: bool = False

    @property
    def failed(self) -> int:
        """Samples whose device result differs from the CPU's, or that raised on the device only."""
        return len(self.failures)


@dataclass
class OpResult:
    """The conformance of one operator of the plugin's op table.

    ``status`` is ``"passed"``, ``"failed"``, ``"no_samples"`` (no OpInfo
    covers the operator, or none of its samples dispatched it), ``"random"``
    (random operators cannot be compared with the CPU) or ``"custom"`` (a
    plugin's own operator, outside ATen).
    """

    name: str
    status: str
    reason: str = ""
    opinfos: list[str] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """False only when a sample failed."""
        return self.status != "failed"

    @property
    def samples_run(self) -> int:
        """Samples run that exercised the operator (forward and autograd)."""
        return sum(c.samples_run for c in self.checks)

    @property
    def samples_failed(self) -> int:
        """Failing samples among them."""
        return sum(c.failed for c in self.checks)

    @property
    def max_abs_error(self) -> float:
        """The largest absolute difference from the CPU seen in any sample."""
        return max((c.max_abs_error for c in self.checks), default=0.0)

    @property
    def max_rel_error(self) -> float:
        """The largest relative difference from the CPU seen in any sample."""
        return max((c.max_rel_error for c in self.checks), default=0.0)


@dataclass
class ModelCoverage:
    """The operators one model dispatches and how the plugin serves them."""

    model: str
    traced: dict[str, int] = field(default_factory=dict)
    native: list[str] = field(default_factory=list)
    fallback: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    device_fallbacks: dict[str, int] = field(default_factory=dict)
    max_abs_error: float | None = None
    error: str = ""

    @property
    def coverage_percent(self) -> float:
        """Share of the traced operators that did not fall back to the CPU."""
        seen = set(self.traced) | set(self.fallback)
        return 100.0 * (1 - len(self.fallback) / len(seen)) if seen else 0.0


@dataclass
class CoverageReport:
    """Operator coverage of standard models: native kernels versus CPU fallbacks."""

    models: list[ModelCoverage] = field(default_factory=list)
    skipped: str = ""

    @property
    def traced(self) -> list[str]:
        """Every operator the models dispatch (union; with those that fell back only on the device)."""
        return sorted({op for m in self.models for op in (*m.traced, *m.fallback)})

    @property
    def native(self) -> list[str]:
        """Operators served by the plugin's own kernels."""
        return sorted({op for m in self.models for op in m.native})

    @property
    def fallback(self) -> list[str]:
        """Operators that ran on the CPU instead."""
        return sorted({op for m in self.models for op in m.fallback})

    @property
    def coverage_percent(self) -> float:
        """Share of the distinct traced operators that did not fall back."""
        traced = self.traced
        return 100.0 * (1 - len(self.fallback) / len(traced)) if traced else 0.0

    @property
    def native_percent(self) -> float:
        """Share of the distinct traced operators served by plugin kernels."""
        traced = self.traced
        return 100.0 * len(self.native) / len(traced) if traced else 0.0

    @property
    def passed(self) -> bool:
        """False when a model failed to run on the device."""
        return not any(m.error for m in self.models)


@dataclass
class IntegrityReport:
    """The ``torchfl-abi verify`` checks of the plugin library."""

    path: str | None = None
    exit_code: int | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    @property
    def passed(self) -> bool:
        """True when every check passed (or no library file could be checked)."""
        return self.exit_code in (0, None) and not any(c.get("status") == "fail" for c in self.checks)


@dataclass
class CompatReport:
    """What :func:`test_compatibility` found.

    Attributes:
        device: the device name checked.
        plugin: identity of the plugin (name, vendor, version, ABI, path).
        dtypes: the dtypes checked.
        ops: one :class:`OpResult` per operator of the op table checked.
        coverage: model coverage, or None when not run.
        integrity: ABI checks, or None when not run.
        duration_s: wall time of the run.
    """

    device: str
    plugin: dict[str, Any]
    dtypes: list[str]
    ops: list[OpResult] = field(default_factory=list)
    coverage: CoverageReport | None = None
    integrity: IntegrityReport | None = None
    duration_s: float = 0.0
    torch_version: str = torch.__version__
    torch_fl_version: str = _native.__version__

    @property
    def failed_ops(self) -> list[OpResult]:
        """Operators with at least one failing sample."""
        return [op for op in self.ops if op.status == "failed"]

    @property
    def passed(self) -> bool:
        """True when no sample failed, every model ran and every ABI check passed."""
        return (
            not self.failed_ops
            and (self.coverage is None or self.coverage.passed)
            and (self.integrity is None or self.integrity.passed)
        )

    def counts(self) -> dict[str, int]:
        """Operators per status, and samples run and failed."""
        out: dict[str, int] = {"ops": len(self.ops)}
        for op in self.ops:
            out[op.status] = out.get(op.status, 0) + 1
        out["samples_run"] = sum(op.samples_run for op in self.ops)
        out["samples_failed"] = sum(op.samples_failed for op in self.ops)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (what :meth:`to_json` serializes)."""
        ops = []
        for op in self.ops:
            entry = asdict(op)
            entry.update(
                samples_run=op.samples_run,
                samples_failed=op.samples_failed,
                max_abs_error=op.max_abs_error,
                max_rel_error=op.max_rel_error,
            )
            ops.append(entry)
        coverage = None
        if self.coverage is not None:
            coverage = {
                "coverage_percent": self.coverage.coverage_percent,
                "native_percent": self.coverage.native_percent,
                "traced": self.coverage.traced,
                "native": self.coverage.native,
                "fallback": self.coverage.fallback,
                "skipped": self.coverage.skipped,
                "models": [{**asdict(m), "coverage_percent": m.coverage_percent} for m in self.coverage.models],
            }
        integrity = None
        if self.integrity is not None:
            integrity = {**asdict(self.integrity), "passed": self.integrity.passed}
        return {
            "passed": self.passed,
            "device": self.device,
            "plugin": self.plugin,
            "dtypes": self.dtypes,
            "torch_version": self.torch_version,
            "torch_fl_version": self.torch_fl_version,
            "duration_s": self.duration_s,
            "summary": self.counts(),
            "ops": ops,
            "coverage": coverage,
            "integrity": integrity,
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (non-finite numbers become null)."""
        return json.dumps(_finite(self.to_dict()), indent=indent)

    def summary(self) -> str:
        """A few lines for the terminal: verdict, counts, failures, coverage, integrity."""
        c = self.counts()
        p = self.plugin
        lines = [
            f"torch-fl compatibility: {p.get('name')} {p.get('version')} (ABI {p.get('abi_version')}) "
            f"as device '{self.device}': {'PASSED' if self.passed else 'FAILED'} in {self.duration_s:.1f} s",
            f"  operators: {c['ops']} checked ({', '.join(self.dtypes)}): {c.get('passed', 0)} passed, "
            f"{c.get('failed', 0)} failed, {c.get('no_samples', 0)} without samples, "
            f"{c.get('random', 0)} random, {c.get('custom', 0)} custom",
            f"  samples: {c['samples_run']} run, {c['samples_failed']} failed",
        ]
        timed_out = sorted({ch.opinfo for op in self.ops for ch in op.checks if ch.timed_out})
        if timed_out:
            lines.append(f"  stopped at the per-op time budget: {', '.join(timed_out)}")
        for op in self.failed_ops:
            lines.append(
                f"  FAIL {op.name}: {op.samples_failed}/{op.samples_run} samples, "
                f"max abs error {op.max_abs_error:.3g}, max rel error {op.max_rel_error:.3g}"
            )
            for check in op.checks:
                for failure in check.failures[:2]:
                    lines.append(f"       [{check.opinfo} {check.kind} {check.dtype}] {failure.sample}")
                    lines.append(f"         {_first_line(failure.error)}")
        if self.coverage is not None:
            cov = self.coverage
            lines.append(
                f"  coverage: {len(cov.traced)} operators traced, {cov.native_percent:.1f}% native, "
                f"{cov.coverage_percent:.1f}% without CPU fallback"
            )
            for m in cov.models:
                state = f"error: {_first_line(m.error)}" if m.error else f"{m.coverage_percent:.1f}%"
                falls = f"; fell back: {', '.join(sorted(m.device_fallbacks))}" if m.device_fallbacks else ""
                lines.append(f"    {m.model}: {state}{falls}")
            if cov.skipped:
                lines.append(f"    skipped: {cov.skipped}")
        if self.integrity is not None:
            integ = self.integrity
            if integ.error:
                lines.append(f"  integrity: {integ.error}")
            else:
                ok = sum(1 for ch in integ.checks if ch.get("status") == "pass")
                lines.append(f"  integrity: {ok}/{len(integ.checks)} ABI checks passed (torchfl-abi verify)")
                for ch in integ.checks:
                    if ch.get("status") == "fail":
                        lines.append(f"    FAIL {ch.get('id')}: {ch.get('detail')}")
        return "\n".join(lines)

    def write(self, report_dir: PathLike) -> dict[str, Path]:
        """Write ``compat.json``, ``compat.html`` and ``compat.txt`` (the summary) into ``report_dir``.

        Returns:
            ``{"json": path, "html": path, "summary": path}``.
        """
        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "compat.json", "html": out / "compat.html", "summary": out / "compat.txt"}
        paths["json"].write_text(self.to_json() + "\n", encoding="utf-8")
        paths["html"].write_text(render_html(self), encoding="utf-8")
        paths["summary"].write_text(self.summary() + "\n", encoding="utf-8")
        return paths


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --- op names -------------------------------------------------------------------


def op_name(func: Any) -> str:
    """The op-table spelling of an ``OpOverload``: ``add.Tensor``, ``relu``, ``sim::fused_bias_gelu``."""
    schema_name: str = func._schema.name
    ns, _, base = schema_name.partition("::")
    overload = func._overloadname
    name = base if ns == "aten" else schema_name
    return name if overload in ("default", "") else f"{name}.{overload}"


def _base(name: str) -> str:
    return name.split(".", 1)[0]


def _overload(name: str) -> str:
    return name.split(".", 1)[1] if "." in name else ""


def _exercises(table_op: str, dispatched: Iterable[str]) -> bool:
    """Whether a sample that dispatched ``dispatched`` ran the kernel of ``table_op``.

    An ``out`` entry (``abs.out``) serves its functional and in-place forms too.
    """
    names = set(dispatched)
    if table_op in names:
        return True
    if _overload(table_op).endswith("out"):
        base = _base(table_op)
        return any(_base(n) in (base, base + "_") for n in names)
    return False


def _served_natively(op: str, table: Sequence[str]) -> bool:
    """Whether a plugin kernel serves ``op``: listed, or the same operator in another form.

    ``sigmoid_`` is served by a ``sigmoid`` entry (structured operators share
    one kernel registered as ``out``), ``abs`` by ``abs.out``.
    """
    if op in table:
        return True

    def key(name: str) -> tuple[str, str]:
        overload = _overload(name)
        return _base(name).rstrip("_"), "" if overload in ("", "out") else overload

    return key(op) in {key(t) for t in table}


# --- OpInfo ---------------------------------------------------------------------


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
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def find_opinfos(table_op: str, op_db: Sequence[Any]) -> list[tuple[Any, str]]:
    """The OpInfos that exercise ``table_op``, each with the variant to run (``"function"`` or ``"inplace"``)."""
    base = _base(table_op)
    by_name: dict[str, list[Any]] = {}
    for info in op_db:
        for key in {info.name, info.aten_name}:
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
        super().__init__()
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
    if variant == "inplace":
        return opinfo.inplace_variant
    if variant.startswith("overload:"):
        name = variant[len("overload:") :]
        packet = getattr(torch.ops.aten, _base(name))
        return _scalar_args(getattr(packet, _overload(name) or "default"))
    return opinfo.op


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


Run = tuple[str, str, torch.dtype, list[_Sample], bool]


def _suspects(sample: _Sample, table: Sequence[str]) -> set[str]:
    """The table operators a sample dispatched (``copy_`` is infrastructure, not a suspect)."""
    return {t for t in table if t != "copy_" and "::" not in t and _exercises(t, sample.dispatched)}


def _proven_bad(runs: Iterable[list[_Sample]], table: Sequence[str]) -> set[str]:
    """Operators that fail samples in which they were the only table operator dispatched."""
    bad: set[str] = set()
    for samples in runs:
        for s in samples:
            if s.outcome == "failed":
                suspects = _suspects(s, table)
                if len(suspects) == 1:
                    bad |= suspects
    return bad


def _checks_for(
    table_op: str, runs: list[Run], table: Sequence[str], bad: set[str]
) -> tuple[list[CheckResult], set[str]]:
    """Aggregate the samples that exercised ``table_op``; return the checks and operators blamed instead."""
    checks: list[CheckResult] = []
    blamed: set[str] = set()
    for label, variant, dtype, samples, timed_out in runs:
        for kind in ("forward", "autograd"):
            mine = [
                s for s in samples if s.kind == kind and s.outcome != "skipped" and _exercises(table_op, s.dispatched)
            ]
            if not mine:
                continue
            check = CheckResult(label, variant, str(dtype).replace("torch.", ""), kind, timed_out=timed_out)
            for s in mine:
                others = (_suspects(s, table) & bad) - {table_op} if s.outcome == "failed" else set()
                if others and table_op not in bad:
                    # Another operator this sample dispatched fails on its own.
                    check.skipped += 1
                    blamed |= others
                    continue
                check.samples_run += 1
                check.max_abs_error = max(check.max_abs_error, s.max_abs)
                check.max_rel_error = max(check.max_rel_error, s.max_rel)
                if s.outcome == "passed":
                    check.passed += 1
                else:
                    check.failures.append(SampleFailure(s.description, s.error, kind, s.max_abs, s.max_rel))
            check.skipped += sum(1 for s in samples if s.kind == kind and s.outcome == "skipped")
            checks.append(check)
    return checks, blamed


# --- coverage -------------------------------------------------------------------


def _models() -> list[tuple[str, Callable[[], torch.nn.Module], Callable[[], Any]]]:
    models: list[tuple[str, Callable[[], torch.nn.Module], Callable[[], Any]]] = []
    try:
        import torchvision

        models.append(
            (
                "resnet18 (2x3x32x32, forward+backward)",
                lambda: torchvision.models.resnet18(weights=None, num_classes=10),
                lambda: torch.randn(2, 3, 32, 32),
            )
        )
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
    return models


def _first_tensor(output: Any) -> torch.Tensor:
    leaves, _ = tree_flatten(output)
    return next(t for t in leaves if isinstance(t, torch.Tensor))


def _model_step(model: torch.nn.Module, data: torch.Tensor) -> torch.Tensor:
    out = _first_tensor(model(data))
    out.sum().backward()
    return out.detach()


def run_coverage(device: str, table: Sequence[str]) -> CoverageReport:
    """Trace the standard models on the CPU and run them on the device; classify their operators."""
    from .. import fallback_stats, reset_fallback_stats

    report = CoverageReport()
    if not any(name.startswith("resnet") for name, _, _ in _models()):
        report.skipped = "resnet18: torchvision is not installed"
    for name, make, data in _models():
        cov = ModelCoverage(name)
        try:
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
        except Exception as err:
            cov.error = f"{type(err).__name__}: {_first_line(str(err), 400)}"
            missing = re.search(r"Could not run '(?:aten::)?([\w.]+)' with arguments from the 'CPU' backend", str(err))
            if missing:
                cov.error = (
                    f"on the device PyTorch dispatches {missing.group(1)}, which has no CPU kernel for the CPU "
                    f"fallback to use: the plugin must implement it ({cov.error})"
                )
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
        report.models.append(cov)
    return report


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = op_name(func)
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


# --- integrity ------------------------------------------------------------------

_VERIFY = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("torch_fl._native", sys.argv[1])
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
sys.exit(native.abi_main(["torchfl-abi", "verify", "--json", sys.argv[2]]))
"""


def run_integrity(plugin_path: str | None, timeout: float = 120) -> IntegrityReport:
    """Run ``torchfl-abi verify --json`` on ``plugin_path`` in a subprocess (without importing torch)."""
    report = IntegrityReport(path=plugin_path)
    if not plugin_path:
        report.error = "the plugin has no library file to verify (preloaded or built in)"
        return report
    native_file = getattr(_native, "__file__", None)
    if native_file is None:
        report.error = "torch_fl._native has no file"
        return report
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _VERIFY, native_file, plugin_path],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        report.error = f"torchfl-abi verify did not run: {err}"
        return report
    report.exit_code = proc.returncode
    try:
        data = json.loads(proc.stdout)
        report.checks = list(data.get("checks", []))
    except ValueError:
        report.error = f"torchfl-abi verify exited {proc.returncode}: {_first_line(proc.stderr or proc.stdout)}"
    return report


# --- progress -------------------------------------------------------------------


class _Progress:
    def __init__(self, total: int, enabled: bool, width: int = 30) -> None:
        self.total = max(total, 1)
        self.enabled = enabled and sys.stderr.isatty()
        self.width = width
        self.done = 0

    def step(self, label: str) -> None:
        if not self.enabled:
            return
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        sys.stderr.write(f"\r  [{bar}] {self.done}/{self.total} {label[:40]:40s}")
        sys.stderr.flush()
        self.done += 1

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * (self.width + 60) + "\r")
            sys.stderr.flush()


# --- the entry point ------------------------------------------------------------


def _resolve_device(
    device: str | registration.PluginHandle, plugin_path: PathLike | None
) -> tuple[str, list[_native.Plugin]]:
    if isinstance(device, registration.PluginHandle):
        return device.device, [device.plugin]
    bound = _native.bound_device_name()
    if bound == device and plugin_path is None:
        return device, registration.bound_plugins()
    handle = registration.register_device_plugin(name=device, plugin_path=plugin_path)
    if bound == device:
        return device, [handle.plugin]
    return device, registration.bound_plugins()


def test_compatibility(
    device: str | registration.PluginHandle = "sim",
    ops: Sequence[str] | None = None,
    *,
    plugin_path: PathLike | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    autograd: bool = True,
    coverage: bool = True,
    integrity: bool = True,
    max_samples_per_op: int = 8,
    max_numel: int = 20_000,
    time_budget_per_op_s: float = 10.0,
    report_dir: PathLike | None = None,
    progress: bool = True,
) -> CompatReport:
    """Check a plugin device against PyTorch's CPU results; report conformance, coverage and integrity.

    Every ATen operator of the plugin's op table is matched to PyTorch's OpInfo
    database; each sample runs on the CPU and on the device and the results
    (and, for differentiable operators, the gradients) are compared with
    ``torch.testing.assert_close``'s default tolerances for the dtype. A
    sample counts for the table operators it dispatched on the device. The run
    resets :func:`torch_fl.fallback_stats`.

    Args:
        device: a registered device name, a name to register now (the bundled
            simulated accelerator for ``"sim"``, or ``plugin_path``), or the
            :class:`~torch_fl.PluginHandle` that :func:`register_device_plugin`
            returned.
        ops: op-table names to check (``["add.Tensor", "relu"]``); default:
            the whole op table.
        plugin_path: the plugin library to register as ``device`` when the
            process has no device yet.
        dtypes: the dtypes of the sample inputs (float32 by default).
        autograd: also compare gradients of differentiable operators.
        coverage: trace a ResNet-18, a Transformer encoder and an LSTM
            (forward and backward) and run them on the device.
        integrity: run the ``torchfl-abi verify`` checks on the plugin file.
        max_samples_per_op: sample inputs per OpInfo, variant and dtype.
        max_numel: skip samples with more tensor elements than this.
        time_budget_per_op_s: stop taking samples of an OpInfo after this long.
        report_dir: where to write ``compat.json``, ``compat.html`` and ``compat.txt``.
        progress: draw a progress bar on stderr (only on a terminal).

    Returns:
        A :class:`CompatReport`; ``report.passed`` is False when a sample
        failed, a model did not run, or an ABI check failed.

    Raises:
        torch_fl.TorchFLError: the plugin could not be registered.

    Example::

        import torch_fl
        report = torch_fl.test_compatibility("sim", ops=["add.Tensor", "relu"], coverage=False)
        print(report.summary())
    """
    started = time.monotonic()
    name, plugins = _resolve_device(device, plugin_path)
    table: list[str] = []
    for plugin in plugins:
        table += [op for op in plugin.ops if op not in table]
    runtime = plugins[0]
    report = CompatReport(
        device=name,
        plugin={
            "name": runtime.name,
            "vendor": runtime.vendor,
            "version": runtime.plugin_version,
            "abi_version": runtime.abi_version,
            "path": runtime.path,
            "ops": len(table),
        },
        dtypes=[str(d).replace("torch.", "") for d in dtypes],
    )
    selected = list(ops) if ops is not None else table
    op_db = load_op_db()
    runner = _OpInfoRunner(
        name,
        max_samples=max_samples_per_op,
        max_numel=max_numel,
        time_budget_s=time_budget_per_op_s,
        autograd=autograd,
    )
    bar = _Progress(len(selected) + int(coverage) + int(integrity), progress)
    from .. import reset_fallback_stats

    try:
        with warnings.catch_warnings():
            # PyTorch's sample generators, the CPU fallback and backend flags warn;
            # none of it is about the plugin.
            warnings.simplefilter("ignore")
            phase1 = []
            for table_op in selected:
                bar.step(table_op)
                phase1.append(_run_op(table_op, table, op_db, runner, dtypes))
            bad = _proven_bad((samples for samples, _ in runner.cache.values()), table)
            report.ops = [_finish_op(result, runs, table, bad) for result, runs in phase1]
            if coverage:
                bar.step("coverage: models")
                report.coverage = run_coverage(name, table)
            if integrity:
                bar.step("integrity: torchfl-abi verify")
                report.integrity = run_integrity(runtime.path)
    finally:
        bar.close()
        reset_fallback_stats()
    report.duration_s = time.monotonic() - started
    if report_dir is not None:
        report.write(report_dir)
    return report


# Not a pytest test, despite its name.
test_compatibility.__test__ = False  # type: ignore[attr-defined]


def _exercised(table_op: str, samples: list[_Sample]) -> bool:
    return any(s.outcome != "skipped" and _exercises(table_op, s.dispatched) for s in samples)


def _run_op(
    table_op: str, table: Sequence[str], op_db: Sequence[Any], runner: _OpInfoRunner, dtypes: Sequence[torch.dtype]
) -> tuple[OpResult, list[Run]]:
    """Run the samples of the OpInfos that describe ``table_op`` (phase 1 of its check)."""
    if "::" in table_op:
        return OpResult(table_op, "custom", "a plugin operator outside ATen: no OpInfo describes it"), []
    if _base(table_op) in RANDOM_OPS:
        return OpResult(table_op, "random", "random operator: the device's random stream differs from the CPU's"), []
    result = OpResult(table_op, "no_samples")
    if table_op not in table:
        result.reason = "not in the plugin's op table; "
    runs: list[Run] = []
    try:
        matches = find_opinfos(table_op, op_db)
        result.opinfos = [f"{_opinfo_label(i)} ({v})" for i, v in matches]
        for opinfo, variant in matches:
            for dtype in dtypes:
                samples, timed_out = runner.run(opinfo, variant, dtype)
                runs.append((_opinfo_label(opinfo), variant, dtype, samples, timed_out))
        if matches and not any(_exercised(table_op, r[3]) for r in runs) and hasattr(torch.ops.aten, _base(table_op)):
            # The functional forms never dispatched this overload (``add.Scalar``:
            # ``torch.add(t, 2)`` dispatches ``add.Tensor``): call the overload
            # itself with the samples that bind to its schema.
            seen: list[Any] = []
            for opinfo, _ in matches:
                if opinfo in seen:
                    continue
                seen.append(opinfo)
                for dtype in dtypes:
                    samples, timed_out = runner.run(opinfo, f"overload:{table_op}", dtype)
                    runs.append((_opinfo_label(opinfo), "overload", dtype, samples, timed_out))
    except Exception as err:  # one bad operator never aborts the run
        result.status = "failed"
        result.reason += f"the harness failed: {type(err).__name__}: {err}"
        return result, []
    if not matches:
        result.reason += "no OpInfo in torch.testing._internal describes this operator"
    return result, runs


def _finish_op(result: OpResult, runs: list[Run], table: Sequence[str], bad: set[str]) -> OpResult:
    """Aggregate the samples that exercised the operator into its verdict (phase 2)."""
    if not runs:
        return result
    result.checks, blamed = _checks_for(result.name, runs, table, bad)
    if blamed:
        result.reason += (
            f"samples that failed because of {', '.join(sorted(blamed))} (which fails on its own) are not counted; "
        )
    known = sum(
        1 for r in runs for smp in r[3] if smp.error.startswith(_KNOWN) and _exercises(result.name, smp.dispatched)
    )
    if known:
        result.reason += f"{known} differing samples not counted: {_KNOWN} (test_compare_cpu); "
    if not result.checks or not any(c.samples_run for c in result.checks):
        result.reason += "no sample of its OpInfos dispatched it on the device (in the dtypes checked)"
    elif any(c.failures for c in result.checks):
        result.status = "failed"
    else:
        result.status = "passed"
    return result


# --- HTML -----------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f2f2f2}
.passed,.pass{background:#e3f6e3}.failed,.fail{background:#fbdada}
.no_samples,.random,.custom,.skip{background:#f4f4f4;color:#666}
.verdict{font-size:1.2em;font-weight:bold;padding:.3em .6em;display:inline-block}
pre{white-space:pre-wrap;font-size:.85em;margin:0}
code{font-size:.9em}
"""


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return "inf" if math.isinf(x) else f"{x:.3g}"


def render_html(report: CompatReport) -> str:
    """A self-contained HTML page of the report (inline CSS, no external assets)."""
    e = html.escape
    c = report.counts()
    verdict = "passed" if report.passed else "failed"
    p = report.plugin
    out = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>torch-fl compatibility: {e(str(p.get('name')))}</title><style>{_CSS}</style></head><body>",
        f"<h1>torch-fl compatibility report: {e(str(p.get('name')))} as device <code>{e(report.device)}</code></h1>",
        f"<div class='verdict {verdict}'>{verdict.upper()}</div>",
        "<h2>Summary</h2><table>",
    ]
    rows = [
        ("plugin", f"{p.get('name')} {p.get('version')} by {p.get('vendor')}, ABI {p.get('abi_version')}"),
        ("library", str(p.get("path"))),
        ("torch / torch-fl", f"{report.torch_version} / {report.torch_fl_version}"),
        ("dtypes", ", ".join(report.dtypes)),
        ("operators checked", str(c["ops"])),
        ("passed / failed", f"{c.get('passed', 0)} / {c.get('failed', 0)}"),
        (
            "without samples / random / custom",
            f"{c.get('no_samples', 0)} / {c.get('random', 0)} / {c.get('custom', 0)}",
        ),
        ("samples run / failed", f"{c['samples_run']} / {c['samples_failed']}"),
        ("duration", f"{report.duration_s:.1f} s"),
    ]
    if report.coverage is not None:
        rows.append(
            (
                "coverage",
                f"{report.coverage.native_percent:.1f}% native, "
                f"{report.coverage.coverage_percent:.1f}% without CPU fallback",
            )
        )
        broken = [m.model for m in report.coverage.models if m.error]
        if broken:
            rows.append(("models that did not run on the device", ", ".join(broken)))
    if report.integrity is not None:
        rows.append(("integrity", "passed" if report.integrity.passed else "FAILED"))
    out += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows]
    out.append("</table>")

    out.append("<h2>Operators</h2><table><tr><th>operator</th><th>status</th><th>samples</th><th>failed</th>")
    out.append("<th>max abs error</th><th>max rel error</th><th>OpInfos / reason</th></tr>")
    for op in report.ops:
        info = ", ".join(op.opinfos) if op.opinfos else ""
        note = "; ".join(x for x in (info, op.reason) if x)
        out.append(
            f"<tr class='{e(op.status)}'><td><code>{e(op.name)}</code></td><td>{e(op.status)}</td>"
            f"<td>{op.samples_run}</td><td>{op.samples_failed}</td><td>{_fmt(op.max_abs_error)}</td>"
            f"<td>{_fmt(op.max_rel_error)}</td><td>{e(note)}</td></tr>"
        )
    out.append("</table>")

    if report.failed_ops:
        out.append("<h2>Failing samples</h2>")
        for op in report.failed_ops:
            out.append(f"<h3><code>{e(op.name)}</code></h3><table>")
            out.append("<tr><th>OpInfo</th><th>kind</th><th>dtype</th><th>sample</th><th>abs</th><th>rel</th>")
            out.append("<th>error</th></tr>")
            for check in op.checks:
                for f in check.failures:
                    out.append(
                        f"<tr class='fail'><td>{e(check.opinfo)}</td><td>{e(f.kind)}</td><td>{e(check.dtype)}</td>"
                        f"<td><code>{e(f.sample)}</code></td><td>{_fmt(f.max_abs_error)}</td>"
                        f"<td>{_fmt(f.max_rel_error)}</td><td><pre>{e(f.error[:2000])}</pre></td></tr>"
                    )
            if op.reason:
                out.append(f"<tr class='fail'><td colspan='7'>{e(op.reason)}</td></tr>")
            out.append("</table>")

    if report.coverage is not None:
        out.append("<h2>Coverage</h2>")
        if report.coverage.skipped:
            out.append(f"<p>{e(report.coverage.skipped)}</p>")
        for m in report.coverage.models:
            out.append(f"<h3>{e(m.model)}</h3>")
            if m.error:
                out.append(f"<p class='fail'>did not run on the device: <code>{e(m.error)}</code></p>")
            out.append(
                f"<p>{len(m.traced)} operators traced; {m.coverage_percent:.1f}% without CPU fallback; "
                f"output max abs error vs CPU: {_fmt(m.max_abs_error)}</p><table>"
            )
            for label, names, css in (
                ("native (plugin kernels)", m.native, "pass"),
                ("fell back to the CPU", m.fallback, "fail" if m.fallback else "pass"),
                ("no plugin kernel, no CPU fallback (views, factories, composites)", m.other, "skip"),
            ):
                listed = ", ".join(f"{n} ({m.traced.get(n, m.device_fallbacks.get(n, 0))})" for n in names) or "none"
                out.append(f"<tr class='{css}'><th>{e(label)}</th><td>{e(listed)}</td></tr>")
            ground = ", ".join(f"{k} ({v})" for k, v in m.device_fallbacks.items()) or "none"
            out.append(f"<tr><th>fallback_stats() on the device</th><td>{e(ground)}</td></tr></table>")

    if report.integrity is not None:
        integ = report.integrity
        out.append(f"<h2>Integrity (torchfl-abi verify)</h2><p>{e(str(integ.path))}</p>")
        if integ.error:
            out.append(f"<p class='fail'>{e(integ.error)}</p>")
        out.append("<table><tr><th>check</th><th>status</th><th>detail</th></tr>")
        for ch in integ.checks:
            status = str(ch.get("status"))
            out.append(
                f"<tr class='{e(status)}'><td>{e(str(ch.get('title', ch.get('id'))))}</td>"
                f"<td>{e(status)}</td><td>{e(str(ch.get('detail', '')))}</td></tr>"
            )
        out.append("</table>")
    out.append("</body></html>\n")
    return "\n".join(out)
