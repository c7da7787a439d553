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


def readme_section(heading: str) -> str:
    """The README's text under ``heading``, up to the next section of the same level."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index(f"\n{heading}\n")
    end = readme.find("\n## ", start + len(heading) + 2)
    return readme[start : end if end != -1 else len(readme)]


def layout_entries() -> set[str]:
    """The first word of each line of the code blocks under "Repository layout"."""
    blocks = re.findall(r"```\n(.*?)```", readme_section("## Repository layout"), flags=re.S)
    return {line.split()[0] for block in blocks for line in block.splitlines() if line.strip()}


def test_readme_layout_lists_every_crate_package_and_module() -> None:
    package = ROOT / "python" / "torch_fl"
    expected = {f"crates/{p.name}" for p in (ROOT / "crates").iterdir() if (p / "Cargo.toml").is_file()}
    expected |= {f"python/{p.name}" for p in (ROOT / "python").iterdir() if (p / "__init__.py").is_file()}
    expected |= {p.name for p in package.iterdir() if p.suffix in (".py", ".pyi")}
    expected |= {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    missing = sorted(expected - layout_entries())
    assert not missing, f"README.md's 'Repository layout' section does not describe {missing}"


def test_readme_layout_names_only_what_exists() -> None:
    package = ROOT / "python" / "torch_fl"
    stale = sorted(e for e in layout_entries() if not ((ROOT / e).exists() or (package / e).exists()))
    assert not stale, f"README.md's 'Repository layout' section names what does not exist: {stale}"


def test_cpp_shim_readme_lists_every_source_file() -> None:
    readme = (ROOT / "cpp_shim" / "README.md").read_text()
    listed = set()
    for name in re.findall(r"^\| `([\w/]+\.\w+(?:/\.\w+)*)` \|", readme, flags=re.M):
        stem, first, more = re.fullmatch(r"(.+?)\.(\w+)((?:/\.\w+)*)", name).groups()
        listed |= {f"{stem}.{ext}" for ext in [first, *more.split("/.")[1:]]}  # "trace.h/.cpp": both
    src = ROOT / "cpp_shim" / "src"
    sources = {p.relative_to(src).as_posix() for p in src.rglob("*") if p.suffix in (".h", ".cpp")}
    assert not sources - listed, f"cpp_shim/README.md's file table lacks {sorted(sources - listed)}"
    assert not listed - sources, f"cpp_shim/README.md's file table names missing files: {sorted(listed - sources)}"
