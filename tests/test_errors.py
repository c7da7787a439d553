"""The exception hierarchy mirrors the core's error enum."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import torch_fl
from torch_fl import errors

from .conftest import ROOT


def test_every_class_derives_from_torch_fl_error() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) == len(errors.__all__)
    for cls in classes:
        assert issubclass(cls, torch_fl.TorchFLError), cls
        assert cls.__doc__, f"{cls.__name__} has no docstring"
        assert getattr(torch_fl, cls.__name__) is cls, f"torch_fl does not export {cls.__name__}"


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (torch_fl.PluginFileNotFoundError, FileNotFoundError),
        (torch_fl.PluginNotFoundError, LookupError),
        (torch_fl.InvalidDeviceNameError, ValueError),
        (torch_fl.OutOfMemoryError, torch.OutOfMemoryError),
        (torch_fl.UnimplementedError, NotImplementedError),
        (torch_fl.KernelError, RuntimeError),
    ],
)
def test_builtin_bases(cls, builtin) -> None:
    assert issubclass(cls, builtin)


def test_every_core_variant_has_a_python_class() -> None:
    # The Rust mapping is exhaustive by construction; check its targets exist.
    mapping = (ROOT / "crates" / "torchfl-python" / "src" / "error.rs").read_text()
    targets = set(re.findall(r'=> "(\w+)"', mapping))
    variants = set(re.findall(r"Error::(\w+) \{ \.\. \} =>", mapping))
    core = (ROOT / "crates" / "torchfl-core" / "src" / "error.rs").read_text()
    enum_body = core.split("pub enum Error {", 1)[1].split("\n}\n", 1)[0]
    declared = set(re.findall(r"^    (\w+) \{", enum_body, flags=re.M))
    assert variants == declared, "every core variant is mapped"
    for name in targets:
        assert isinstance(getattr(errors, name), type), name
    assert Path(errors.__file__).name == "errors.py"
