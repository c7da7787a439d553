"""The entry point: :func:`test_compatibility` resolves the device, runs the checks and writes the reports."""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .. import _native, registration
from ..fallback import reset_fallback_stats
from .conformance import check_ops
from .coverage import run_coverage
from .integrity import run_integrity
from .opinfo import _OpInfoRunner, load_op_db
from .report import CompatReport, PathLike

__all__ = ["test_compatibility"]


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


def _resolve_device(
    device: str | registration.PluginHandle, plugin_path: PathLike | None
) -> tuple[str, list[_native.Plugin]]:
    if isinstance(device, registration.PluginHandle):
        return device.device, [device.plugin]
    bound = _native.bound_device_name()
    if bound == device and plugin_path is None:
        return device, _native.bound_plugins()
    handle = registration.register_device_plugin(name=device, plugin_path=plugin_path)
    if bound == device:
        return device, [handle.plugin]
    return device, _native.bound_plugins()


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
        coverage: trace standard models (a ResNet-18 and, with torchvision, MobileNet-v3, DeepLabV3, Faster
            R-CNN and ViT; a Transformer encoder, an LSTM), forward and backward, and run them on the device.
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
    table = _op_table(plugins)
    runtime = plugins[0]
    report = CompatReport(
        device=name,
        plugin=_plugin_identity(runtime, table),
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
    try:
        with warnings.catch_warnings():
            # PyTorch's sample generators, the CPU fallback and backend flags warn;
            # none of it is about the plugin.
            warnings.simplefilter("ignore")
            report.ops = check_ops(selected, table, op_db, runner, dtypes, bar.step)
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


def _op_table(plugins: Sequence[_native.Plugin]) -> list[str]:
    """The operators the device's plugins serve, each once, in the plugins' order."""
    table: list[str] = []
    for plugin in plugins:
        table += [op for op in plugin.ops if op not in table]
    return table


def _plugin_identity(runtime: _native.Plugin, table: Sequence[str]) -> dict[str, Any]:
    """The report's ``plugin`` entry: the runtime plugin's identity and the size of the op table."""
    return {
        "name": runtime.name,
        "vendor": runtime.vendor,
        "version": runtime.plugin_version,
        "abi_version": runtime.abi_version,
        "path": runtime.path,
        "ops": len(table),
    }
