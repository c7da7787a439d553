"""The report: what :func:`torch_fl.test_compatibility` found, as one :class:`CompatReport`.

The whole report with its verdict, counts, JSON form and terminal summary,
and the files it writes. Its parts (one failing sample up to the coverage and
integrity sections) are the plain types of :mod:`torch_fl.compat.model`,
re-exported here; the HTML page comes from :mod:`torch_fl.compat.render`,
which reads the report through :class:`~torch_fl.compat.model.ReportView`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import _native
from .model import CheckResult as CheckResult
from .model import CoverageReport as CoverageReport
from .model import IntegrityReport as IntegrityReport
from .model import ModelCoverage as ModelCoverage
from .model import OpResult as OpResult
from .model import PathLike as PathLike
from .model import SampleFailure as SampleFailure
from .model import _first_line
from .render import render_html


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
