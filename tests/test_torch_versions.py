"""One torch-fl for torch 2.13-2.15: the supported range and the shim for the installed torch.

The shim bundled in the package is built against the torch of the build
environment; under another supported torch, torch_fl compiles one into a
cache at first import (torch_fl/_shim.py). ``make test-torch TORCH=<version>``
runs the whole suite under another torch; these tests cover the selection
logic and the compiler invocation under the pinned one.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
import torch

from torch_fl import _native, _paths, _shim

from .conftest import run_python


@pytest.mark.parametrize("version", ["2.13.0", "2.14.1", "2.15.0", "2.15.0rc1", "2.13.0a0"])
def test_supported_releases(version: str) -> None:
    _shim.check_supported(version)


@pytest.mark.parametrize("version", ["2.12.1", "2.16.0", "2.16.0a0", "3.0.0", "1.13.1", "nightly"])
def test_releases_outside_the_range_are_refused_with_the_range(version: str) -> None:
    with pytest.raises(ImportError, match=r"torch-fl supports torch 2\.13 to 2\.15, but torch .* is installed"):
        _shim.check_supported(version)


def test_the_loaded_shim_is_for_the_installed_torch() -> None:
    installed, path = _shim.installed_torch(), _shim.locate()
    assert _shim.loaded == path  # what `import torch_fl` loaded
    if installed == _native.BUILT_TORCH_VERSION:
        assert path == _paths.SHIM  # the bundled one
    else:  # make test-torch: built at first import into the cache
        assert path.is_relative_to(_shim.cache_root() / "shim") and f"torch-{installed}-" in path.parent.name


def test_importing_under_an_unsupported_torch_is_one_clear_error() -> None:
    result = run_python("import torch\ntorch.__version__ = '2.12.0'\nimport torch_fl\n")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: torch-fl supports torch 2.13 to 2.15, but torch 2.12.0 is installed"), last


@pytest.fixture
def other_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Pretends a supported torch other than the build's is installed; returns the cache root."""
    monkeypatch.setattr(_shim, "installed_torch", lambda: "2.15.0")
    monkeypatch.setenv("TORCH_FL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCH_FL_SHIM_BUILD", raising=False)
    return tmp_path


def test_another_torch_builds_once_into_the_cache_even_when_racing(
    other_torch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[Path] = []

    def fake_build(src: Path, target: Path, version: str) -> None:
        assert version == "2.15.0" and (src / "src" / "api.cpp").is_file()
        builds.append(target)
        threading.Event().wait(0.2)  # long enough for the other callers to queue on the lock
        shutil.copyfile(_paths.SHIM, target)

    monkeypatch.setattr(_shim, "build", fake_build)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(_shim.locate())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(builds) == 1 and len(set(results)) == 1 and results[0] == builds[0]
    target = results[0]
    assert target.is_relative_to(other_torch / "shim") and target.name == _shim.SHIM_NAME
    assert "torch-2.15.0-" in target.parent.name
    assert _shim.locate() == target and len(builds) == 1  # later imports load the cached library


def test_building_can_be_forbidden(other_torch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FL_SHIM_BUILD", "0")
    with pytest.raises(ImportError, match=r"TORCH_FL_SHIM_BUILD=0 forbids building one for it") as info:
        _shim.locate()
    assert str(other_torch) in str(info.value) and f"torch=={_native.BUILT_TORCH_VERSION}" in str(info.value)


def test_no_compiler_says_what_to_do(other_torch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-anywhere")
    with pytest.raises(ImportError, match=r"no C\+\+ compiler was found \('no-such-compiler-anywhere'"):
        _shim.locate()


def test_the_package_ships_the_shim_sources() -> None:
    src = _shim.sources()
    shipped = {p.name for p in (src / "src").iterdir()}
    assert {"api.cpp", "py_generator.cpp", "plugin_kernel.cpp", "plugin_kernel.h"} <= shipped
    assert (src / "include" / "torchfl_shim.h").is_file()
    assert (src / "include" / "torch_fl" / "plugin.h").is_file()


@pytest.mark.timeout(300)
def test_the_first_use_build_compiles_with_the_wheels_flags(tmp_path: Path) -> None:
    # One translation unit, the one that needs both PyTorch's and Python's
    # headers, with the flags a first-use build passes (the whole build is
    # `make test-torch`'s job: minutes of compiling).
    src = _shim.sources()
    error = _shim.compile_source(
        _shim.compiler(),
        _shim.compile_flags(src, torch.__version__.split("+")[0]),
        src / "src" / "py_generator.cpp",
        tmp_path / "py_generator.o",
    )
    assert error is None, error
    assert (tmp_path / "py_generator.o").stat().st_size > 0
