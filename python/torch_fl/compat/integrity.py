"""Integrity: the ABI checks of ``torchfl-abi verify`` on the plugin library.

The checks run in the installed tool, ``python -m torchfl_abi verify --json``,
in a child process: the tool loads torch-fl's native module without importing
torch, and a plugin that crashes or hangs in a check cannot take the
compatibility run down with it.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

from .model import IntegrityReport, _first_line

__all__ = ["run_integrity"]

#: The directory that holds the ``torch_fl`` package in use (site-packages, or
#: ``python/`` in a source tree); the ``torchfl_abi`` package is installed beside it.
_PACKAGES_DIR = Path(__file__).resolve().parents[2]


def run_integrity(plugin_path: str | None, timeout: float = 120) -> IntegrityReport:
    """Run ``torchfl-abi verify --json`` on ``plugin_path`` in a subprocess (without importing torch)."""
    report = IntegrityReport(path=plugin_path)
    if not plugin_path:
        report.error = "the plugin has no library file to verify (preloaded or built in)"
        return report
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "torchfl_abi", "verify", "--json", plugin_path],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=_tool_environment(),
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


def _tool_environment() -> dict[str, str] | None:
    """The environment in which ``python -m torchfl_abi`` imports the tool beside this ``torch_fl``.

    Returns:
        None (inherit this process's) when ``torch_fl`` is installed in a
        site-packages directory, where the interpreter finds the tool anyway;
        otherwise (a source tree, a directory added to ``sys.path``) a copy
        with that directory first on ``PYTHONPATH``.
    """
    site_dirs = {Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages())}
    if _PACKAGES_DIR in site_dirs:
        return None
    env = dict(os.environ)
    others = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(_PACKAGES_DIR)]
    env["PYTHONPATH"] = os.pathsep.join([str(_PACKAGES_DIR), *others])
    return env
