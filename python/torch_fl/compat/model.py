"""The report model's plain types: what :func:`torch_fl.test_compatibility` found, short of the whole report.

Dataclasses from one failing sample up to the coverage and integrity
sections, and :class:`ReportView`, what a rendering reads of the whole
:class:`~torch_fl.compat.report.CompatReport`. This module imports nothing
else of the package: the report (:mod:`~torch_fl.compat.report`), the HTML
page it writes (:mod:`~torch_fl.compat.render`) and the checks that fill the
report in all build on it, and the page never imports the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Union

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


class ReportView(Protocol):
    """What a rendering reads of a :class:`~torch_fl.compat.report.CompatReport` (which satisfies it)."""

    device: str
    plugin: dict[str, Any]
    dtypes: list[str]
    ops: list[OpResult]
    coverage: CoverageReport | None
    integrity: IntegrityReport | None
    duration_s: float
    torch_version: str
    torch_fl_version: str

    @property
    def failed_ops(self) -> list[OpResult]:
        """Operators with at least one failing sample."""
        ...

    @property
    def passed(self) -> bool:
        """True when no sample failed, every model ran and every ABI check passed."""
        ...

    def counts(self) -> dict[str, int]:
        """Operators per status, and samples run and failed."""
        ...


def _first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."
