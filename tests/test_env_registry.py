"""One registry of environment variables (torch_fl/_env.py): the code, the README and `torch_fl info` agree with it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import ROOT

#: A ``TORCH_FL_*`` or ``TORCHFL_*`` name (not a prefix such as ``TORCH_FL_SIM_*``
#: nor a header guard such as ``TORCH_FL_PLUGIN_H_``).
NAME = re.compile(r"\b(?:TORCH_FL|TORCHFL)_[A-Z0-9_]*[A-Z0-9]\b")
#: Header guards without the trailing underscore (``TORCHFL_SHIM_PRECOMPILED_H``).
HEADER_GUARD = re.compile(r"_H$")

#: Names in the code that are not environment variables, and what they are.
NOT_VARIABLES = {
    "TORCHFL_HAS_KINETO": "a preprocessor macro of the shim (cpp_shim/src/observe/kineto_profiler.cpp)",
    "TORCHFL_TORCH_VERSION": "a preprocessor definition the shim is compiled with (build.rs, _shim.py)",
    "TORCHFL_BUILT_TORCH_VERSION": "set by build.rs for the compiler (option_env!), not read at run time",
}


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    return _load(ROOT / "tools" / "gen_env_table.py", "gen_env_table")


@pytest.fixture(scope="module")
def registry(tool: ModuleType) -> ModuleType:
    # The checkout's registry (the installed package may be older).
    return tool.load_registry()


def _sources() -> list[Path]:
    """The code that may read a variable: Python, the crates (and their build scripts), the C++ shim."""
    files = [
        *(ROOT / "python").rglob("*.py"),
        *(ROOT / "python").rglob("*.pyi"),
        *(ROOT / "crates").glob("*/src/**/*.rs"),
        *(ROOT / "crates").glob("*/build.rs"),
        *(ROOT / "cpp_shim").rglob("*.cpp"),
        *(ROOT / "cpp_shim").rglob("*.h"),
    ]
    # python/torch_fl/_lib holds build outputs (a copy of the shim's sources).
    return sorted(f for f in files if "_lib" not in f.relative_to(ROOT).parts)


def test_the_registry_is_well_formed(registry: ModuleType) -> None:
    names = registry.names()
    assert len(names) == len(set(names)), "a variable is listed twice"
    for v in registry.VARIABLES:
        assert v.readers and set(v.readers) <= set(registry.READERS), (v.name, v.readers)
        assert v.default and v.meaning and "\n" not in v.meaning, v.name
        assert registry.by_name(v.name) is v
    with pytest.raises(KeyError):
        registry.by_name("TORCH_FL_NO_SUCH_VARIABLE")


def test_every_variable_the_code_names_is_registered(registry: ModuleType) -> None:
    registered = set(registry.names())
    unlisted: dict[str, list[str]] = {}
    for path in _sources():
        for name in NAME.findall(path.read_text(encoding="utf-8", errors="replace")):
            if name not in registered and name not in NOT_VARIABLES and not HEADER_GUARD.search(name):
                unlisted.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not unlisted, (
        "the code names environment variables python/torch_fl/_env.py does not list (add them, then run "
        f"python tools/gen_env_table.py): {unlisted}"
    )


def test_every_registered_variable_is_named_in_the_code(registry: ModuleType) -> None:
    code = "\n".join(path.read_text(encoding="utf-8", errors="replace") for path in _sources())
    stale = [name for name in registry.names() if name not in code]
    assert not stale, f"python/torch_fl/_env.py lists variables nothing reads: {stale}"


def test_the_readme_table_is_generated_from_the_registry(tool: ModuleType, registry: ModuleType) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert tool.updated(readme, registry) == readme, (
        "README.md's environment-variable table differs from python/torch_fl/_env.py: run python tools/gen_env_table.py"
    )
    start, end = tool.section(readme)
    table = readme[start:end]
    assert re.findall(r"^\| `([A-Z0-9_]+)` \|", table, flags=re.M) == list(registry.names())


def test_the_readme_names_only_registered_variables(registry: ModuleType) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unknown = sorted(set(NAME.findall(readme)) - set(registry.names()))
    assert not unknown, f"the README names variables torch-fl does not read: {unknown}"


def test_the_generator_rewrites_a_stale_table(tool: ModuleType, registry: ModuleType) -> None:
    stale = f"# x\n\n{tool.BEGIN}\n| old | table |\n{tool.END}\n\nafter\n"
    new = tool.updated(stale, registry)
    assert new.startswith(f"# x\n\n{tool.BEGIN}\n| variable | default | read by | meaning |")
    assert new.endswith(f"{tool.END}\n\nafter\n") and "| old | table |" not in new
    assert tool.updated(new, registry) == new


def test_info_lists_every_variable_with_the_values_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_fl import _env, info

    assert info.VARIABLES == _env.names()
    for name in _env.names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_FL_TRACE", "/tmp/trace-{pid}.json")
    monkeypatch.setenv("TORCHFL_ABI_EXE", "/opt/bin/torchfl-abi")
    report = info.environment_report()
    assert report["environment"] == {
        "TORCH_FL_TRACE": "/tmp/trace-{pid}.json",
        "TORCHFL_ABI_EXE": "/opt/bin/torchfl-abi",
    }
    text = info.render(report)
    section = text.split("\nenvironment (", 1)[1].splitlines()[1:]
    assert [line.split()[0].split("=")[0] for line in section] == list(_env.names())
    assert "  TORCH_FL_TRACE=/tmp/trace-{pid}.json" in section
    assert "  TORCHFL_ABI_EXE=/opt/bin/torchfl-abi" in section
    init_timeout = next(line for line in section if line.split()[0] == "TORCH_FL_INIT_TIMEOUT")
    assert init_timeout.endswith("(unset; default: 60)"), init_timeout


def test_the_readme_info_sample_counts_the_registry(registry: ModuleType) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    counts = re.findall(r"^environment \((?:none|\d+) of the (\d+) variables torch-fl reads set\):$", readme, re.M)
    assert counts == [str(len(registry.VARIABLES))], counts
