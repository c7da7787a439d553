"""Rendering: the report as a self-contained HTML page.

The functions only read a report: a :class:`~torch_fl.compat.report.CompatReport`,
seen through :class:`~torch_fl.compat.model.ReportView`. They import the plain
types of :mod:`torch_fl.compat.model`, never the report module, which calls
them (:meth:`CompatReport.write`).
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import CoverageReport, IntegrityReport, ReportView

__all__ = ["render_html"]

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


def render_html(report: ReportView) -> str:
    """A self-contained HTML page of the report (inline CSS, no external assets)."""
    e = html.escape
    verdict = "passed" if report.passed else "failed"
    p = report.plugin
    out = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>torch-fl compatibility: {e(str(p.get('name')))}</title><style>{_CSS}</style></head><body>",
        f"<h1>torch-fl compatibility report: {e(str(p.get('name')))} as device <code>{e(report.device)}</code></h1>",
        f"<div class='verdict {verdict}'>{verdict.upper()}</div>",
        "<h2>Summary</h2><table>",
    ]
    out += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _summary_rows(report)]
    out.append("</table>")
    out += _operators_table(report)
    out += _failing_samples(report)
    if report.coverage is not None:
        out += _coverage_section(report.coverage)
    if report.integrity is not None:
        out += _integrity_section(report.integrity)
    out.append("</body></html>\n")
    return "\n".join(out)


def _summary_rows(report: ReportView) -> list[tuple[str, str]]:
    """The rows of the summary table: plugin identity, counts, coverage and integrity verdicts."""
    c = report.counts()
    p = report.plugin
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
    return rows


def _operators_table(report: ReportView) -> list[str]:
    """One row per operator checked: status, samples, largest errors, OpInfos and reason."""
    e = html.escape
    out = ["<h2>Operators</h2><table><tr><th>operator</th><th>status</th><th>samples</th><th>failed</th>"]
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
    return out


def _failing_samples(report: ReportView) -> list[str]:
    """A table of the failing samples of each failed operator (nothing when none failed)."""
    e = html.escape
    if not report.failed_ops:
        return []
    out = ["<h2>Failing samples</h2>"]
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
    return out


def _coverage_section(coverage: CoverageReport) -> list[str]:
    """Per model: native, fallen-back and other operators, and the device's fallback statistics."""
    e = html.escape
    out = ["<h2>Coverage</h2>"]
    if coverage.skipped:
        out.append(f"<p>{e(coverage.skipped)}</p>")
    for m in coverage.models:
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
    return out


def _integrity_section(integ: IntegrityReport) -> list[str]:
    """The ``torchfl-abi verify`` checks: one row each, or the reason they did not run."""
    e = html.escape
    out = [f"<h2>Integrity (torchfl-abi verify)</h2><p>{e(str(integ.path))}</p>"]
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
    return out
