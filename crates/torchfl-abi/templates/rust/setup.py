"""Builds the plugin crate with cargo and ships the library in the package.

The library is an ordinary shared object exporting torch_fl_plugin_get_api
(Python never imports it). `cargo build --release` needs no network: the
only dependency, torchfl-ffi, is vendored under vendor/.
"""

import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

LIBRARY = "libtorchfl_{{device}}.so"


class BuildWithCargo(build_py):
    """Runs cargo, then copies the library next to the package's Python code."""

    def run(self) -> None:
        super().run()
        here = Path(__file__).resolve().parent
        # --target-dir: the library's path must not depend on CARGO_TARGET_DIR.
        cargo = ["cargo", "build", "--release", "--manifest-path", str(here / "Cargo.toml")]
        subprocess.run([*cargo, "--target-dir", str(here / "target")], check=True)
        target = Path(self.build_lib) / "{{package}}"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(here / "target" / "release" / LIBRARY, target / LIBRARY)


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for the platform, not pure Python."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildWithCargo}, distclass=BinaryDistribution)
