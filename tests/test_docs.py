"""The public API is documented, and the documentation's examples run."""

from __future__ import annotations

import inspect
import re

import torch_fl
from torch_fl.distributed import python_backends_supported

from .conftest import ROOT, assert_ok, run_python


def test_public_api_has_docstrings() -> None:
    for name in torch_fl.__all__:
        obj = getattr(torch_fl, name)
        if callable(obj):
            assert inspect.getdoc(obj), f"torch_fl.{name} has no docstring"


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def test_readme_python_examples_run(tmp_path, monkeypatch) -> None:
    # Examples write files (traces) into the current directory: not the checkout's.
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert blocks, "the README has Python examples"
    for block in blocks:
        if "init_process_group" in block and not python_backends_supported():
            continue  # torch 2.13 (make test-torch): the README says the backend needs torch >= 2.14
        assert_ok(run_python(block))


def test_package_docstring_example_runs() -> None:
    after = torch_fl.__doc__.split("::\n\n", 1)[1]
    lines = []
    for line in after.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line)
    example = "\n".join(lines)
    assert "register_device_plugin" in example
    assert "sim:0" in assert_ok(run_python(example))


def test_fused_operator_walkthrough_runs() -> None:
    blocks = python_blocks((ROOT / "docs" / "fused-operators.md").read_text())
    assert len(blocks) >= 5, "the walkthrough's examples were found"
    for block in blocks:
        assert_ok(run_python(block))
