"""The torchfl-abi command installed with the wheel."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torch_fl import _paths


def torchfl_abi() -> list[str]:
    exe = Path(sys.executable).parent / "torchfl-abi"
    return [str(exe)] if exe.exists() else [shutil.which("torchfl-abi") or "torchfl-abi"]


def test_verify_the_bundled_plugin() -> None:
    out = subprocess.run([*torchfl_abi(), "verify", "--json", str(_paths.SIM_PLUGIN)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["summary"]["failed"] == 0 and report["identity"]["name"] == "sim"


def test_exit_code_for_a_plugin_that_cannot_load(tmp_path) -> None:
    bad = tmp_path / "libbad.so"
    bad.write_text("nope")
    out = subprocess.run([*torchfl_abi(), "inspect", str(bad)], capture_output=True, text=True)
    assert out.returncode == 3
    assert "no ELF header" in out.stderr


@pytest.mark.parametrize("args", [["symbol", "add_.Tensor"], ["--version"]])
def test_small_commands(args) -> None:
    out = subprocess.run([*torchfl_abi(), *args], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.strip()
