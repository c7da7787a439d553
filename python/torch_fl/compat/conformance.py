"""Operator verdicts: from the samples the OpInfo runner took to one :class:`OpResult` per table operator.

An operator is checked in two phases. :func:`_run_op` runs the samples of the
OpInfos that describe it; once every operator ran, :func:`_proven_bad` names the
operators that fail samples on their own, and :func:`_finish_op` counts for
each operator the samples that exercised it, not blaming it for samples that
failed because of another, proven-bad operator.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Callable

import torch

from .model import CheckResult, OpResult, SampleFailure
from .names import _base, _exercises
from .opinfo import _KNOWN, _opinfo_label, _OpInfoRunner, _Sample, find_opinfos

__all__ = ["RANDOM_OPS", "check_ops"]

#: Random operators: the device's random stream differs from the CPU's, so
#: values cannot be compared with a CPU run.
RANDOM_OPS = frozenset(
    {"uniform_", "normal_", "bernoulli_", "random_", "native_dropout", "exponential_", "multinomial", "randperm"}
)


#: The samples of one OpInfo, variant and dtype: (OpInfo label, variant, dtype, samples, timed out).
Run = tuple[str, str, torch.dtype, list[_Sample], bool]


def check_ops(
    selected: Sequence[str],
    table: Sequence[str],
    op_db: Sequence[Any],
    runner: _OpInfoRunner,
    dtypes: Sequence[torch.dtype],
    on_op: Callable[[str], None],
) -> list[OpResult]:
    """Check each of the ``selected`` operators: run their samples, then judge each (both phases).

    Args:
        selected: the op-table names to check.
        table: the whole op table of the device (the suspects of a failing sample).
        op_db: PyTorch's OpInfo database (:func:`~torch_fl.compat.opinfo.load_op_db`).
        runner: runs and caches the samples.
        dtypes: the dtypes of the sample inputs.
        on_op: called with each operator's name before its samples run (progress).

    Returns:
        One :class:`OpResult` per selected operator, in order.
    """
    phase1: list[tuple[OpResult, list[Run]]] = []
    for table_op in selected:
        on_op(table_op)
        phase1.append(_run_op(table_op, table, op_db, runner, dtypes))
    bad = _proven_bad((samples for samples, _ in runner.cache.values()), table)
    return [_finish_op(result, runs, table, bad) for result, runs in phase1]


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
