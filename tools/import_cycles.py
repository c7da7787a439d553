"""Finds import cycles: between Python modules of the package, and between Rust modules of each crate.

``make lint`` runs it. A cycle means two modules each need the other, so
neither can be read, tested or moved alone; the layers of
``shared/design/architecture.md`` only hold when every arrow runs one way.

- **Python** (``python/``): every ``import`` and ``from ... import`` in a
  module counts, wherever it stands: at the top, inside a function (where a
  cycle likes to hide) or under ``if TYPE_CHECKING:``. ``from . import x``
  names the submodule ``x`` when there is one, else the package.
- **Rust** (``crates/*/src``): ``crate::a::b`` and ``super::...`` paths in a
  file name the module they reach (the longest module prefix). A module and
  the modules inside it are one unit (a parent declares its children, and
  children use their parent's private items), so only arrows between
  modules that do not contain each other count.

Cycles listed in ``KNOWN`` are reported but tolerated until they are
removed; any other cycle fails. The list may only shrink.

Usage: ``python tools/import_cycles.py`` (exit 1 on a new cycle).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Cycles that exist today, each as the sorted names of its modules; they
#: are to be removed, never added to.
KNOWN: set[tuple[str, ...]] = set()


# -- Python ------------------------------------------------------------------


def python_modules(top: Path) -> dict[str, Path]:
    """Every module under ``top`` (a folder holding packages), by dotted name."""
    out = {}
    # A stub (.pyi) stands for a compiled module (torch_fl._native).
    for path in sorted([*top.rglob("*.py"), *top.rglob("*.pyi")], key=lambda p: p.suffix == ".pyi"):
        parts = list(path.relative_to(top).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            out.setdefault(".".join(parts), path)
    return out


def _resolve_from(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def python_edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``a -> {b, ...}``: the package's modules each module imports."""
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(name, is_package, node.level, node.module)
                # `from pkg import sub` imports the submodule when there is one.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                # The deepest module of the package that the name reaches.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


# -- Rust --------------------------------------------------------------------

_PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
_COMMENT = re.compile(r"//[^\n]*")


def rust_modules(src: Path, crate: str) -> dict[str, Path]:
    """Every module of the crate rooted at ``src`` (lib.rs), as ``crate::a::b``."""
    out = {}
    for path in sorted(src.rglob("*.rs")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "mod" or parts == ["lib"] or parts == ["main"]:
            parts.pop()
        out["::".join([crate, *parts])] = path
    return out


def rust_edges(modules: dict[str, Path], crate: str) -> dict[str, set[str]]:
    """``a -> {b, ...}`` between modules of one crate, from ``crate::`` and ``super::`` paths."""
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        text = _COMMENT.sub("", path.read_text(encoding="utf-8"))
        for anchor, rest in _PATH.findall(text):
            segments = rest.split("::")[1:]
            if anchor == "crate":
                base = [crate]
            else:
                # super:: is the parent module (for a/mod.rs as for a/b.rs).
                base = name.split("::")[:-1]
                while segments and segments[0] == "super":
                    segments.pop(0)
                    base = base[:-1]
            target = "::".join([*base, *segments])
            while target and target not in modules:
                target = target.rpartition("::")[0]
            if target and not _nested(name, target, "::"):
                edges[name].add(target)
    return edges


def _nested(a: str, b: str, sep: str) -> bool:
    """Whether one of the two modules contains the other (or they are the same)."""
    return a == b or a.startswith(b + sep) or b.startswith(a + sep)


# -- cycles ------------------------------------------------------------------


def cycles(edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def _collapse_rust(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Rust edges with every module folded into its top-level module (``crate::a::b`` -> ``crate::a``).

    A cycle among the files of one folder module is one between its
    children, which the nesting rule already allows within the folder;
    across folders it shows as a cycle of the top-level modules.
    """

    def top(m: str) -> str:
        return "::".join(m.split("::")[:2])

    out: dict[str, set[str]] = {}
    for a, targets in edges.items():
        for b in targets:
            if top(a) != top(b):
                out.setdefault(top(a), set()).add(top(b))
        out.setdefault(top(a), set())
    return out


def all_cycles(root: Path = ROOT) -> list[tuple[str, ...]]:
    """Every cycle of the tree under ``root``: Python's, then each crate's."""
    found = cycles(python_edges(python_modules(root / "python")))
    for src in sorted((root / "crates").glob("*/src")):
        crate = src.parent.name.replace("-", "_")
        modules = rust_modules(src, crate)
        edges = rust_edges(modules, crate)
        found += cycles(edges)
        # Folded to top-level modules, to see cycles through sub-folders too.
        found += [c for c in cycles(_collapse_rust(edges)) if c not in found]
    return found


def main(argv: Iterable[str] = ()) -> int:
    found = all_cycles()
    new = [c for c in found if c not in KNOWN]
    for c in found:
        mark = "known" if c in KNOWN else "NEW"
        print(f"{mark:5}  cycle: {' <-> '.join(c)}")
    gone = sorted(KNOWN - set(found))
    for c in gone:
        print(f"gone   {' <-> '.join(c)}: remove it from KNOWN in {Path(__file__).relative_to(ROOT)}")
    if new:
        print(
            f"{len(new)} new import cycle(s): make the arrows run one way (move what both need into a module "
            "below them, or pass it in)"
        )
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
