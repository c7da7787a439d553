"""The OpenCL plugin as a vendor ships it: a plugin package, and one image for every chip.

``crates/torchfl-opencl/package`` is installed with pip (its setup.py builds
the plugin with cargo) into a directory of its own, which the subprocesses
put on their path, never into .venv: an installed plugin package autoloads
in every later process. With the C example's package beside it, the image
brings up ``ocl`` where an OpenCL driver is present (the package asks for a
higher priority) and ``minimal_c`` where none is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._opencl import NEEDS_OPENCL
from .conftest import ROOT, assert_ok, run_python

pytestmark = NEEDS_OPENCL
TIMEOUT = 300
NO_DRIVER = {"TORCH_FL_OPENCL_LIBRARY": "/nonexistent/libOpenCL.so.1"}


def _pip_install(source: Path, site: Path) -> None:
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--target", str(site), str(source)], check=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def opencl_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("opencl_site")
    _pip_install(ROOT / "crates" / "torchfl-opencl" / "package", site)
    return site


@pytest.fixture(scope="module")
def image(opencl_site: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The OpenCL package and the C example's, as one image carries both."""
    c_site = tmp_path_factory.mktemp("c_site")
    _pip_install(ROOT / "examples" / "c_plugin", c_site)
    return [opencl_site, c_site]


def run(code: str, sites: list[Path], **env: str) -> str:
    path = os.pathsep.join([*map(str, sites), os.environ.get("PYTHONPATH", "")])
    return assert_ok(run_python(code, env={"PYTHONPATH": path, **env}, timeout=TIMEOUT))


def test_the_package_ships_the_plugin_and_import_torch_brings_up_ocl(opencl_site: Path) -> None:
    assert (opencl_site / "torchfl_opencl" / "libtorchfl_opencl.so").is_file()
    out = run(
        """
import torch
from torch_fl import _native
print("BEFORE", _native.plugin_initialized())
x = torch.arange(4.0, device="ocl")
print("VALUES", (x * 2 + 1).cpu().tolist(), torch.ocl.device_count())
import torch_fl
(row,) = [p for p in torch_fl.list_plugins() if p.name == "ocl"]
print("ROW", row.status, row.source)
""",
        [opencl_site],
    )
    assert "BEFORE False" in out  # autoload prepares; the first use initializes
    assert "VALUES [1.0, 3.0, 5.0, 7.0] 1" in out
    assert "ROW registered package torchfl-opencl 0.1.0 (entry point ocl = torchfl_opencl:plugin)" in out, out


def test_one_image_brings_up_opencl_where_a_driver_is_and_the_c_plugin_where_none_is(image: list[Path]) -> None:
    code = """
import torch
print("HAS", [name for name in ("ocl", "minimal_c") if hasattr(torch, name)])
"""
    assert "HAS ['ocl']" in run(code, image)
    assert "HAS ['minimal_c']" in run(code, image, **NO_DRIVER)
    path = os.pathsep.join([*map(str, image), os.environ.get("PYTHONPATH", "")])
    info = subprocess.run(
        [sys.executable, "-m", "torch_fl", "info", "--json"],
        env={**os.environ, "PYTHONPATH": path, **NO_DRIVER},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert info.returncode == 0, info.stderr
    auto = json.loads(info.stdout)["autoload"]
    assert auto["device"] == "minimal_c", auto
    (ocl,) = [c for c in auto["candidates"] if c["name"] == "ocl"]
    assert not ocl["chosen"] and ocl["priority"] == 10
    assert "no OpenCL driver" in ocl["reason"] and "pocl-opencl-icd" in ocl["reason"], ocl
