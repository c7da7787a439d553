"""``torchfl-abi new``: the projects it writes install as plugin packages and work with ``import torch`` alone.

The Rust integration tests (crates/torchfl-abi/tests/new.rs) check the files,
the refusals and that each project's ``ci.sh`` builds the plugin and passes
``torchfl-abi verify``; here the PyTorch side: the C project's ``ci.sh``
including ``python -m torch_fl compat``, and both projects built and
installed with pip into a directory of their own, then used as a device in
a fresh interpreter through autoload.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import assert_ok, run_python

TIMEOUT = 300


def torchfl_abi() -> str:
    """The torchfl-abi command: ``$TORCHFL_ABI``, else the one installed next to this Python."""
    if os.environ.get("TORCHFL_ABI"):
        return os.environ["TORCHFL_ABI"]
    exe = Path(sys.executable).parent / "torchfl-abi"
    return str(exe) if exe.exists() else shutil.which("torchfl-abi") or "torchfl-abi"


def new_project(tmp_path: Path, device: str, *args: str) -> Path:
    project = tmp_path / device
    subprocess.run(
        [torchfl_abi(), "new", device, "--dir", str(project), *args], check=True, timeout=TIMEOUT, capture_output=True
    )
    return project


def install(project: Path, site: Path) -> None:
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--target", str(site), str(project)],
        check=True,
        timeout=TIMEOUT,
    )


def use_device(device: str, site: Path) -> str:
    code = f"""
        import torch
        x = torch.ones(3, device="{device}")
        print("ADD", (x + x).device, (x + x).cpu().tolist())
        import torch_fl
        print("LISTED", [(p.name, p.source) for p in torch_fl.list_plugins() if p.name == "{device}"])
    """
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return assert_ok(run_python(code, env={"PYTHONPATH": path, "TORCH_FL_DEVICE": device}, timeout=TIMEOUT))


def test_the_c_project_ci_script_runs_verify_and_compat(tmp_path: Path) -> None:
    project = new_project(tmp_path, "newc")
    env = {**os.environ, "PYTHON": sys.executable, "TORCHFL_ABI": torchfl_abi(), "COMPAT_ARGS": "--no-coverage"}
    out = subprocess.run(
        ["bash", str(project / "ci.sh")], env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    assert "19 passed, 0 failed, 2 skipped" in out.stdout
    assert "torch-fl compatibility: newc 0.1.0 (ABI 1.8) as device 'newc': PASSED" in out.stdout
    # The C project's five kernels: add.Tensor, mul.Tensor, neg, relu, fill_.Scalar.
    assert "operators: 5 checked (float32): 5 passed, 0 failed" in out.stdout


@pytest.mark.parametrize("lang", ["c", "rust"])
def test_a_new_project_installs_as_a_plugin_package(tmp_path: Path, lang: str) -> None:
    if lang == "rust" and shutil.which("cargo") is None:
        pytest.skip("cargo is not installed: the Rust project's setup.py builds the plugin with it")
    device = f"new{lang}"
    site = tmp_path / "site"
    install(new_project(tmp_path, device, "--lang", lang), site)
    out = use_device(device, site)
    assert f"ADD {device}:0 [2.0, 2.0, 2.0]" in out
    origin = f"package torchfl-{device} 0.1.0 (entry point {device} = torchfl_{device}:plugin)"
    assert f"LISTED [('{device}', '{origin}')]" in out
