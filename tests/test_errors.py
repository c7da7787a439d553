"""The exception hierarchy mirrors the core's error enum; what each path raises is as errors.py says.

torch-fl's own API raises TorchFLError subclasses; PyTorch operations on the
device raise PyTorch's classes (torch.OutOfMemoryError here; a failing kernel's
torch.AcceleratorError and non-UTF-8 plugin messages are covered with the
fault-injection plugins in test_broken_plugins.py).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import torch_fl
from torch_fl import _native, errors

from .conftest import DEVICE, ROOT


def test_every_class_derives_from_torch_fl_error() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) == len(errors.__all__)
    # The module's one warning class (a plugin registered without something
    # it declares) is a UserWarning; every other class is an error.
    assert [c for c in classes if issubclass(c, Warning)] == [torch_fl.PluginWarning]
    assert issubclass(torch_fl.PluginWarning, UserWarning)
    for cls in classes:
        if cls is not torch_fl.PluginWarning:
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


@pytest.mark.runtime
def test_out_of_memory_inside_an_operator_is_torch_out_of_memory_error() -> None:
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(1 << 40, dtype=torch.uint8, device=DEVICE)
    # Raised by PyTorch's dispatcher from the shim's C++ exception: not a
    # torch-fl class (errors.py says so), but it names the device and sizes.
    assert not isinstance(info.value, torch_fl.TorchFLError)
    message = str(info.value)
    assert message.startswith("plugin 'sim' (") and "allocate failed (OUT_OF_MEMORY)" in message, message
    assert f"{DEVICE}:0 could not allocate 1.00 TiB (" in message and "in use by tensors on this device" in message
    # It says what to do: the caching allocator already gave its cache back
    # before failing, so it suggests freeing tensors and PYTORCH_ALLOC_CONF.
    assert "`del t`" in message and "PYTORCH_ALLOC_CONF" in message, "it says what to do"
    assert torch.ones(4, device=DEVICE).sum().item() == 4.0, "the device still works"


def test_torch_fl_api_errors_are_torch_fl_errors() -> None:
    runtime = _native.bound_runtime()
    assert runtime is not None
    count = runtime.device_count
    with pytest.raises(torch_fl.InvalidDeviceError, match=rf"device index {count} is out of range") as info:
        runtime.synchronize(count)
    assert isinstance(info.value, torch_fl.PluginRuntimeError) and isinstance(info.value, IndexError)
    with pytest.raises(torch_fl.InvalidDeviceNameError) as name_info:
        torch_fl.register_device_plugin(name="cuda")
    assert isinstance(name_info.value, torch_fl.TorchFLError)
