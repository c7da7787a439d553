"""tools/import_cycles.py, which `make lint` runs: it finds cycles, and the tree has none beyond its KNOWN list."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

from .conftest import ROOT


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "tools" / "import_cycles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "python/pkg/__init__.py": "",
            "python/pkg/a.py": "from . import b\n",
            "python/pkg/b.py": "def f():\n    from .a import g\n",
            "python/pkg/c.py": "from .a import b\n",  # one way only
            "python/pkg/_ext.pyi": "def g() -> None: ...\n",
            "python/pkg/d.py": "from . import _ext\n",  # the stub, not the package
        },
    )
    assert _checker().all_cycles(tmp_path) == [("pkg.a", "pkg.b")]


def test_rust_cycles_between_sibling_modules_count_and_parent_child_ones_do_not(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "crates/demo/src/lib.rs": "mod a;\nmod b;\nmod c;\npub use a::A;\n",
            "crates/demo/src/a.rs": "use crate::b::B;\n// crate::c::C in a comment is no arrow\n",
            "crates/demo/src/b.rs": "pub struct B;\nfn f() -> crate::a::A { todo!() }\n",
            "crates/demo/src/c/mod.rs": "mod inner;\nuse inner::I;\n",
            "crates/demo/src/c/inner.rs": "use super::super::b::B;\nuse super::C;\n",
        },
    )
    assert _checker().all_cycles(tmp_path) == [("demo::a", "demo::b")]


def test_the_tree_has_no_cycle_beyond_the_known_ones() -> None:
    checker = _checker()
    found = checker.all_cycles()
    assert [c for c in found if c not in checker.KNOWN] == []
    assert sorted(checker.KNOWN - set(found)) == [], "a known cycle is gone: remove it from KNOWN"
