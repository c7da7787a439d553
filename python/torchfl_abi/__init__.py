"""The ``torchfl-abi`` command, installed with the torch-fl wheel.

It checks plugins without PyTorch, so it loads torch-fl's native module
directly from its file instead of importing the ``torch_fl`` package (whose
``__init__`` imports torch and loads the C++ shim).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType


def _native() -> ModuleType:
    package_dir = Path(__file__).resolve().parent.parent / "torch_fl"
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = package_dir / f"_native{suffix}"
        if path.exists():
            spec = importlib.util.spec_from_file_location("torch_fl._native", path)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return module
    raise ImportError(f"torch-fl's native module is missing from {package_dir}: reinstall torch-fl")


def main() -> None:
    """Entry point of the ``torchfl-abi`` console script."""
    # `verify` isolates the plugin in a child process by re-running the
    # tool; here the process is Python, so name this script as the tool
    # (it passes the child's hidden subcommand through to the native code).
    script = Path(sys.argv[0]).resolve()
    if script.is_file() and os.access(script, os.X_OK):
        os.environ.setdefault("TORCHFL_ABI_EXE", str(script))
    sys.exit(_native().abi_main(["torchfl-abi", *sys.argv[1:]]))
