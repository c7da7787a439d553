"""One torch-fl for a range of torch releases: the supported range and the shim for the installed torch.

The shim bundled in the package is built against the torch of the build
environment; under another supported torch, torch_fl compiles one into a
cache at first import (torch_fl/_shim.py). ``make test-torch TORCH=<version>``
runs the whole suite under another torch; these tests cover the selection
logic and the compiler invocation under the pinned one. The range is stated
once, in torch_fl/_versions.py; the tests at the end check that
pyproject.toml, the Makefile and the README agree with it.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from torch_fl import _native, _paths, _shim, _shim_build, _versions

from .conftest import ROOT, run_python

MIN = "{}.{}".format(*_versions.MIN_TORCH)
MAX = "{}.{}".format(*_versions.MAX_TORCH)
END = "{}.{}".format(*_versions.END_TORCH)
BEFORE = f"{_versions.MIN_TORCH[0]}.{_versions.MIN_TORCH[1] - 1}"
#: "torch-fl supports torch 2.13 to 2.15", as a pattern.
SUPPORTS = re.escape(f"torch-fl supports torch {MIN} to {MAX}")
#: A supported release other than the one the package was built for.
OTHER = f"{MAX}.0" if not (_native.BUILT_TORCH_VERSION or "").startswith(f"{MAX}.") else f"{MIN}.0"


@pytest.mark.parametrize("version", [f"{MIN}.0", "2.14.1", f"{MAX}.0", f"{MAX}.0rc1", f"{MIN}.0a0", f"{MAX}.1+cu130"])
def test_supported_releases(version: str) -> None:
    _shim.check_supported(version)


@pytest.mark.parametrize("version", [f"{BEFORE}.1", f"{END}.0", f"{END}.0a0", "3.0.0", "1.13.1", "nightly"])
def test_releases_outside_the_range_are_refused_with_the_range(version: str) -> None:
    with pytest.raises(ImportError, match=SUPPORTS + r", but torch .* is installed"):
        _shim.check_supported(version)


def test_the_loaded_shim_is_for_the_installed_torch() -> None:
    installed, path = _shim.installed_torch(), _shim.locate()
    assert _shim.loaded == path  # what `import torch_fl` loaded
    if installed == _native.BUILT_TORCH_VERSION:
        assert path == _paths.SHIM  # the bundled one
    else:  # make test-torch: built at first import into the cache
        assert path.is_relative_to(_shim.cache_root() / "shim") and f"torch-{installed}-" in path.parent.name


def test_importing_under_an_unsupported_torch_is_one_clear_error() -> None:
    result = run_python(f"import torch\ntorch.__version__ = '{BEFORE}.0'\nimport torch_fl\n")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert re.match(f"ImportError: {SUPPORTS}, but torch {re.escape(BEFORE)}.0 is installed", last), last


@pytest.fixture
def other_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Pretends a supported torch other than the build's is installed; returns the cache root."""
    monkeypatch.setattr(_shim, "installed_torch", lambda: OTHER)
    monkeypatch.setenv("TORCH_FL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCH_FL_SHIM_BUILD", raising=False)
    return tmp_path


def test_another_torch_builds_once_into_the_cache_even_when_racing(
    other_torch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[Path] = []

    def fake_build(src: Path, target: Path, version: str) -> None:
        assert version == OTHER and (src / "src" / "module.cpp").is_file()
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
    assert f"torch-{OTHER}-" in target.parent.name
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
    shipped = {p.relative_to(src / "src").as_posix() for p in (src / "src").rglob("*") if p.is_file()}
    tree = ROOT / "cpp_shim" / "src"
    repo = {p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file()}
    assert shipped == repo  # every source, in its layer folder
    assert {"module.cpp", "interface.cpp", "dispatch/plugin_kernel.cpp", "dispatch/plugin_kernel.h"} <= shipped
    assert (src / "include" / "torchfl_shim.h").is_file()
    assert (src / "include" / "torch_fl" / "plugin.h").is_file()


@pytest.mark.timeout(300)
def test_the_first_use_build_compiles_with_the_wheels_recipe(tmp_path: Path) -> None:
    # One translation unit of the bundled sources, the one that needs both
    # PyTorch's and Python's headers, with the recipe's flags (the whole
    # build is `make test-torch`'s job: minutes of compiling).
    src = _shim.sources()
    [unit] = [u for u in _shim_build.translation_units(src) if u.name == "module.cpp"]
    flags = _shim_build.compile_flags(src, _shim_build.Torch.installed(), werror=True)
    r = subprocess.run([_shim.compiler(), *flags, "-c", str(unit), "-o", str(tmp_path / "py.o")], capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    assert (tmp_path / "py.o").stat().st_size > 0


def test_the_recipe_builds_a_tree_of_layer_folders(tmp_path: Path) -> None:
    # A tiny shim tree in the recipe's layout (units in folders, includes
    # relative to src/): it compiles, links and replaces its target, leaving
    # no temporary files beside it.
    src = tmp_path / "tree" / "src"
    (src / "runtime").mkdir(parents=True)
    (tmp_path / "tree" / "include").mkdir()
    (tmp_path / "tree" / "include" / "api.h").write_text('extern "C" int tfl_test();\n')
    (src / "runtime" / "light.h").write_text("#pragma once\nint light();\n")
    (src / "runtime" / "light.cpp").write_text('#include "runtime/light.h"\nint light() { return 1; }\n')
    (src / "api.cpp").write_text(
        '#include <map>\n#include "api.h"\n#include "runtime/light.h"\n'
        'extern "C" __attribute__((visibility("default"))) int tfl_test() '
        "{ std::map<int, int> m{{1, 41}}; return m[1] + light(); }\n"
    )
    seen: list[tuple[int, int]] = []
    target = tmp_path / "out" / "libtest.so"
    target.parent.mkdir()
    target.write_text("an older build")
    _shim_build.build(tmp_path / "tree", target, werror=True, jobs=2, progress=lambda d, n: seen.append((d, n)))
    assert seen == [(1, 2), (2, 2)]  # two units: runtime/, and the files directly in src/
    assert ctypes.CDLL(str(target)).tfl_test() == 42
    assert [p.name for p in target.parent.iterdir()] == ["libtest.so"]  # no temporary files left

    # One unit per file builds the same library (another path: dlopen would hand back the loaded one).
    per_file = tmp_path / "out" / "libtest_per_file.so"
    _shim_build.build(tmp_path / "tree", per_file, werror=True, jobs=2, unity=False)
    assert ctypes.CDLL(str(per_file)).tfl_test() == 42


@pytest.mark.parametrize("unity", [True, False], ids=["unity", "per-file"])
def test_the_recipe_reports_the_failing_unit(tmp_path: Path, unity: bool) -> None:
    (tmp_path / "tree" / "src" / "runtime").mkdir(parents=True)
    (tmp_path / "tree" / "include").mkdir()
    (tmp_path / "tree" / "src" / "runtime" / "fine.cpp").write_text("int g() { return 1; }\n")
    (tmp_path / "tree" / "src" / "runtime" / "broken.cpp").write_text("int f() { return undeclared; }\n")
    # The unit, then the compiler's words, which name the file and line either way.
    unit = r"src/runtime/\*\.cpp \(one unit" if unity else r"src/runtime/broken\.cpp:\n"
    with pytest.raises(_shim_build.BuildError, match=rf"(?s){unit}.*src/runtime/broken\.cpp:1:.*undeclared"):
        _shim_build.build(tmp_path / "tree", tmp_path / "libx.so", werror=True, jobs=1, unity=unity)
    assert not (tmp_path / "libx.so").exists()


def test_unity_groups_are_the_layer_folders() -> None:
    # What the wheel's build compiles: one unit per folder of cpp_shim/src,
    # the same on every machine, and every file in exactly one unit.
    tree = ROOT / "cpp_shim"
    groups = _shim_build.unity_groups(tree)
    folders = {p.name for p in (tree / "src").iterdir() if p.is_dir()}
    assert set(groups) == folders | {_shim_build.TOP_GROUP}
    assert sorted(u for units in groups.values() for u in units) == _shim_build.translation_units(tree)
    assert {u.name for u in groups[_shim_build.TOP_GROUP]} == {"module.cpp", "interface.cpp"}


# -- The range is stated once (torch_fl/_versions.py); the rest agrees ---------


def test_pyproject_requires_the_supported_range() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    dependencies = re.search(r"^dependencies = \[(.*?)\]", pyproject, flags=re.M | re.S)
    assert dependencies is not None
    torch_requirements = [d for d in re.findall(r'"([^"]+)"', dependencies.group(1)) if d.startswith("torch")]
    assert torch_requirements == [_versions.REQUIREMENT], torch_requirements


def test_the_readme_states_the_supported_range() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    # "## Supported PyTorch releases": the prose, and the requirement it quotes.
    stated = re.search(r"One torch-fl release serves torch (.+?) \(`pyproject\.toml`: `(.+?)`;", readme)
    assert stated is not None, "the README's range statement was not found"
    assert stated.groups() == (_versions.enumerate_releases(), _versions.REQUIREMENT)
    # `torch_fl info`'s sample output.
    supports = re.findall(r"torch-fl built against [^,]+, supports ([^)]+)\)", readme)
    assert supports and set(supports) == {_versions.SPECIFIER}, supports


def test_the_readme_status_table_covers_the_range() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Supported PyTorch releases", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+\.\d+\.\d+) \|", section, flags=re.M)
    assert rows, "the README's status table was not found"
    outside = [v for v in rows if not _versions.is_supported(v)]
    assert not outside, f"the README's status table lists releases outside {_versions.SPECIFIER}: {outside}"
    minors = {v.rsplit(".", 1)[0] for v in rows}
    assert minors == set(_versions.supported_minors()), f"every supported release has a row: {sorted(minors)}"


def test_the_makefile_pins_only_supported_releases() -> None:
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.findall(r"^TORCHVISION_(\S+) :=", makefile, flags=re.M)
    assert pinned and all(_versions.is_supported(v) for v in pinned), pinned
    assert "python/torch_fl/_versions.py $(TORCH)" in makefile  # test-torch refuses a release outside the range
    built = re.search(r"^TORCH_PINS := torch==(\S+)", makefile, flags=re.M)
    assert built is not None and _versions.is_supported(built.group(1))


def test_the_range_script_runs_without_torch() -> None:
    script = ROOT / "python" / "torch_fl" / "_versions.py"
    assert "import torch" not in script.read_text()  # the Makefile runs it with the system python
    outside = subprocess.run([sys.executable, str(script), f"{END}.0"], capture_output=True, text=True, timeout=60)
    assert outside.returncode == 1 and _versions.REQUIREMENT in outside.stderr, outside.stderr
    inside = subprocess.run([sys.executable, str(script), f"{MIN}.0"], capture_output=True, text=True, timeout=60)
    assert inside.returncode == 0, inside.stderr
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert plain.stdout.strip() == f"{MIN} to {MAX}"
