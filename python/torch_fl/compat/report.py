"""The report model: what :func:`torch_fl.test_compatibility` found, as data.

Dataclasses from one failing sample up to the whole :class:`CompatReport`, with
their verdicts, counts, the JSON form and the terminal summary. The HTML page
comes from :mod:`torch_fl.compat.render`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Union

import torch

from .. import _native
from .render import render_html

PathLike = Union[str, Path]


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
