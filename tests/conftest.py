"""Shared set-up for the pytest suite.

PyTorch has one custom device per process, so the suite registers the
bundled simulated accelerator once, at import, and tests that need a fresh
process (other device names, discovery, out-of-memory limits) run a snippet
in a subprocess with :func:`run_python`.

The same suite runs with the simulated plugin in its default asynchronous
mode, in strict mode (``TORCH_FL_SIM_STRICT=1``: device memory is not
host-addressable, so any host access would crash) and in synchronous mode
(``TORCH_FL_SIM_MODE=sync``); the Makefile runs all three.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torch_fl

from .plugins.build import build_fixture

DEVICE = "sim"
HANDLE = torch_fl.register_device_plugin(name=DEVICE)
STRICT = os.environ.get("TORCH_FL_SIM_STRICT") == "1"
SYNC = os.environ.get("TORCH_FL_SIM_MODE") == "sync"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def sim() -> torch_fl.PluginHandle:
    """The registered simulated accelerator."""
    return HANDLE


@pytest.fixture
def fixture_plugin(tmp_path_factory: pytest.TempPathFactory):
    """Builds a variant of tests/plugins/fixture_plugin.c: ``fixture_plugin(name, *defines)``."""
    out_dir = tmp_path_factory.getbasetemp() / "plugins"

    def build(variant: str, *defines: str) -> Path:
        return build_fixture(out_dir, variant, defines)

    return build


#: Why torchvision tests skip: ``make test-torch`` runs under torch releases
#: that no torchvision release pairs with yet (2.15.0).
NO_TORCHVISION = "torchvision is not installed (no torchvision release pairs with this torch yet)"


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (a fresh PyTorch device) and returns the result."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_ok(result: subprocess.CompletedProcess) -> str:
    """Asserts a :func:`run_python` result succeeded and returns its stdout."""
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def assert_close(actual: torch.Tensor, expected: torch.Tensor, **kw) -> None:
    """Compares a device tensor with a CPU reference (dtype and values)."""
    assert actual.device.type == DEVICE, actual.device
    torch.testing.assert_close(actual.cpu(), expected, **kw)
