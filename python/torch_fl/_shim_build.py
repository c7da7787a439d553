"""The one recipe that compiles torch-fl's C++ shim against the installed torch.

Three builds use it, so their flags cannot drift apart:

- the wheel's: ``crates/torchfl-python/build.rs`` runs this file as a script
  on the source tree (``cpp_shim/`` and ``crates/torchfl-ffi/include``);
- the first use under another supported torch (``_shim.py``) calls
  :func:`build` on the sources the wheel bundles (``_lib/shim_src``);
- a developer's, by hand, as ``cpp_shim/README.md`` shows.

A shim tree is ``<tree>/src`` (the translation units, in folders named after
the shim's layers; includes are written relative to ``src``) and
``<tree>/include`` (the C interface). The plugin ABI's headers come from one
more include directory, or from ``<tree>/include`` in the bundled copy.

The files of one layer folder compile as one translation unit (a unity
build: ``<layer>.cpp`` includes them), the folders in parallel, one compiler
per core, the largest first. Each shim file includes PyTorch's dispatcher
headers, whose parsing and template instantiation is most of the work, so
five units instead of 37 take 60 s of compiler time instead of 227 s (30 s
instead of 116 s on CI's 2 cores). The groups are the folders on every
machine, so a name clash between two files of a folder (two functions of
one name in anonymous namespaces) fails every build alike, CI's included.
A precompiled header of the dispatcher's templates was tried first and left
out: it cost more compiler time than it saved (190 s against 177 s).

Only the standard library and torch are imported: build.rs runs this file as
a script, before the package it belongs to exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

#: Libraries the shim links; torch_python for torch::utils' device_lazy_init fork handler (runtime/fork.cpp).
LIBS = ("-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python")


class BuildError(Exception):
    """A compile or link step failed; the message holds the compiler's output."""


@dataclass(frozen=True)
class Torch:
    """What a shim build needs to know about the installed torch."""

    version: str
    include_dirs: tuple[str, ...]
    lib_dir: str
    cxx11_abi: bool

    @classmethod
    def installed(cls) -> Torch:
        """The torch this interpreter imports."""
        import torch
        from torch.utils import cpp_extension

        return cls(
            version=torch.__version__.split("+")[0],
            include_dirs=(*cpp_extension.include_paths(), sysconfig.get_paths()["include"]),
            lib_dir=str(Path(torch.__file__).resolve().parent / "lib"),
            cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        )


def translation_units(tree: Path) -> list[Path]:
    """Every ``.cpp`` file under ``tree/src``, in a stable order."""
    return sorted((tree / "src").rglob("*.cpp"))


#: The unity group of the files directly in ``src/`` (the module and the core's table).
TOP_GROUP = "shim"


def unity_groups(tree: Path) -> dict[str, list[Path]]:
    """The files of each layer folder of ``tree/src`` (``TOP_GROUP``: those directly in it), sorted."""
    groups: dict[str, list[Path]] = {}
    for unit in translation_units(tree):
        rel = unit.relative_to(tree / "src")
        groups.setdefault(rel.parts[0] if len(rel.parts) > 1 else TOP_GROUP, []).append(unit)
    return groups


def write_unity_sources(tree: Path, out_dir: Path) -> dict[Path, list[Path]]:
    """Writes one ``<group>.cpp`` per unity group into ``out_dir``; maps each to the files it includes."""
    sources = {}
    for name, units in unity_groups(tree).items():
        source = out_dir / f"{name}.cpp"
        source.write_text("".join(f'#include "{u.resolve()}"\n' for u in units))
        sources[source] = units
    return sources


def compile_flags(tree: Path, torch: Torch, include_dirs: Sequence[Path] = (), *, werror: bool) -> list[str]:
    """The compiler flags of every translation unit."""
    flags = ["-std=c++20", "-O2", "-fPIC", "-Wall", "-Wextra", "-fvisibility=hidden", "-fvisibility-inlines-hidden"]
    if werror:
        flags.append("-Werror")
    flags += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.cxx11_abi)}", f'-DTORCHFL_TORCH_VERSION="{torch.version}"']
    for inc in [tree / "src", tree / "include", *include_dirs]:
        flags += ["-I", str(inc)]
    for system in torch.include_dirs:
        flags += ["-isystem", system]  # PyTorch's and Python's own warnings are not the shim's to fix
    return flags


def link_command(cxx: str, objects: Sequence[Path], out: Path, torch: Torch, rpaths: Sequence[str]) -> list[str]:
    """The command that links ``objects`` into the shim ``out``."""
    cmd = [cxx, "-shared", "-o", str(out), *map(str, objects), f"-L{torch.lib_dir}", *LIBS]
    return cmd + [f"-Wl,-rpath,{r}" for r in rpaths]


def compiler() -> str | None:
    """The C++ compiler (``CXX``, else ``c++``), or None when there is none."""
    return shutil.which(os.environ.get("CXX") or "c++")


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"{what}:\n{r.stderr[-6000:]}")
    if r.stderr.strip():  # warnings that are not errors (a first-use build): show them
        sys.stderr.write(r.stderr)


def build(
    tree: Path,
    target: Path,
    *,
    torch: Torch | None = None,
    include_dirs: Sequence[Path] = (),
    werror: bool = True,
    rpaths: Sequence[str] = (),
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    unity: bool = True,
) -> None:
    """Compiles the shim tree ``tree`` against ``torch`` (default: the installed one) into ``target``.

    ``unity``: one translation unit per layer folder (the default; see the
    module's docstring), else one per file (each file's errors alone, for a
    developer chasing one). ``progress(done, total)`` counts units.
    ``target`` is replaced atomically, so a process loading it sees all of
    it or nothing. Raises :class:`BuildError` with the compiler's output.
    """
    torch = torch or Torch.installed()
    cxx = compiler()
    if cxx is None:
        raise BuildError(f"no C++ compiler found ({os.environ.get('CXX') or 'c++'!r}): set CXX or install g++")
    flags = compile_flags(tree, torch, include_dirs, werror=werror)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp_name:
        tmp = Path(tmp_name)
        if unity:
            (tmp / "unity").mkdir()
            groups = write_unity_sources(tree, tmp / "unity")
            units = list(groups)
            sizes = {u: sum(f.stat().st_size for f in files) for u, files in groups.items()}
        else:
            units = translation_units(tree)
            sizes = {u: u.stat().st_size for u in units}
        # Largest first: the longest units overlap the rest instead of running last, alone.
        units.sort(key=lambda u: sizes[u], reverse=True)

        def object_of(unit: Path) -> Path:
            rel = unit.name if unit.is_relative_to(tmp) else str(unit.relative_to(tree / "src")).replace(os.sep, "__")
            return tmp / Path(rel).with_suffix(".o")

        def name_of(unit: Path) -> str:
            if not unit.is_relative_to(tmp):
                return str(unit.relative_to(tree))
            files = "src/*.cpp" if unit.stem == TOP_GROUP else f"src/{unit.stem}/*.cpp"
            return f"{files} (one unit; the compiler names the file)"

        objects = [object_of(u) for u in units]

        def compile_one(pair: tuple[Path, Path]) -> None:
            unit, obj = pair
            _run([cxx, *flags, "-c", str(unit), "-o", str(obj)], name_of(unit))

        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            for done, _ in enumerate(pool.map(compile_one, zip(units, objects, strict=True)), start=1):
                if progress is not None:
                    progress(done, len(units))
        out = tmp / target.name
        _run(link_command(cxx, objects, out, torch, rpaths), "linking")
        os.replace(out, target)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line build.rs runs; prints ``{"torch_version": ...}`` on success."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path, help="the shim tree: <tree>/src and <tree>/include")
    parser.add_argument("--out", type=Path, required=True, help="the shared library to write")
    parser.add_argument("--include", type=Path, action="append", default=[], help="one more include directory")
    parser.add_argument("--rpath", action="append", default=[], help="a run-time search path of the library")
    parser.add_argument("--rpath-torch", action="store_true", help="add the torch's library directory as --rpath")
    parser.add_argument("--no-werror", action="store_true", help="keep warnings, but do not fail on them")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compilers (default: one per core)")
    parser.add_argument(
        "--no-unity", action="store_true", help="one translation unit per file instead of one per layer folder"
    )
    args = parser.parse_args(argv)
    torch = Torch.installed()
    rpaths = [*args.rpath, *([torch.lib_dir] if args.rpath_torch else [])]
    try:
        build(
            args.tree,
            args.out,
            torch=torch,
            include_dirs=args.include,
            werror=not args.no_werror,
            rpaths=rpaths,
            jobs=args.jobs,
            unity=not args.no_unity,
        )
    except BuildError as e:
        sys.stderr.write(f"torch-fl shim build failed in {e}\n")
        return 1
    print(json.dumps({"torch_version": torch.version}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
