"""Builds the plugin library with cargo and ships it inside the package.

The library is the workspace crate `torchfl-opencl` (a cdylib that exports
torch_fl_plugin_get_api and opens libOpenCL at run time); Python never
imports it. `TORCHFL_OPENCL_PREBUILT=<path>` ships an already built library
instead of running cargo (what `make` and the tests do, since the workspace
build has it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
WORKSPACE = HERE.parent.parent.parent
LIBRARY = "libtorchfl_opencl.so"


def _library() -> Path:
    prebuilt = os.environ.get("TORCHFL_OPENCL_PREBUILT")
    if prebuilt:
        return Path(prebuilt)
    subprocess.run(["cargo", "build", "--release", "-p", "torchfl-opencl"], cwd=WORKSPACE, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", WORKSPACE / "target"))
    return target / "release" / LIBRARY


class BuildWithPlugin(build_py):
    """build_py that also places the plugin library in the package."""

    def run(self) -> None:
        super().run()
        library = _library()
        if not library.is_file():
            raise FileNotFoundError(f"the OpenCL plugin library {library} was not built")
        destination = Path(self.build_lib) / "torchfl_opencl" / LIBRARY
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, destination)


class BinaryDistribution(Distribution):
    """A wheel with a native library is platform-specific."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildWithPlugin}, distclass=BinaryDistribution)
