"""What the OpenCL plugin's tests share: the library, why they skip, and a runner.

The tests run each case in a fresh interpreter, since the test process
registered the simulator in the process' one device slot. They need an
OpenCL driver; `make test` installs PoCL (OpenCL on the CPU) when it runs as
root, as CI does. Elsewhere they skip, saying what to install.
"""

from __future__ import annotations

import ctypes
import glob

import pytest

from .conftest import ROOT, assert_ok, run_python

PLUGIN = ROOT / "target" / "release" / "libtorchfl_opencl.so"


def _why_not() -> str | None:
    if not PLUGIN.exists():
        return f"{PLUGIN} is not built (`make install` builds it)"
    if not glob.glob("/etc/OpenCL/vendors/*.icd"):
        return "no OpenCL driver: apt install ocl-icd-libopencl1 pocl-opencl-icd (`make test` does, as root)"
    try:
        ctypes.CDLL("libOpenCL.so.1")
    except OSError as e:
        return f"the OpenCL loader does not open ({e}): apt install ocl-icd-libopencl1"
    return None


WHY_NOT = _why_not()
#: Every OpenCL test module's ``pytestmark``.
NEEDS_OPENCL = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")

PRELUDE = f"""
import torch, torch_fl
handle = torch_fl.register_device_plugin(name="ocl", plugin_path={str(PLUGIN)!r})
"""


def run(code: str, timeout: float = 240, **env: str) -> str:
    """Runs ``code`` after registering the plugin as ``ocl`` in a fresh interpreter; its stdout."""
    return assert_ok(run_python(PRELUDE + code, env=env, timeout=timeout))
