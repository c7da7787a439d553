"""The interface between the Rust core and the C++ shim (cpp_shim/include/torchfl_shim.h).

The shim is an extension module of its own (``torch_fl._C``) that hands the
core one table in a capsule. Both sides restate the header's structs: the C++
shim by including it, the core as ``#[repr(C)]`` mirrors
(crates/torchfl-python/src/shim.rs). A field moved on one side only would
corrupt every call silently, so the C compiler's view of every field is
compared with Rust's, as crates/torchfl-ffi/tests/layout.rs does for the
plugin header.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import torch_fl
from torch_fl import _C, _native, _shim

from .conftest import ROOT

HEADER_DIRS = (ROOT / "cpp_shim" / "include", ROOT / "crates" / "torchfl-ffi" / "include")
COMPILER = shutil.which("cc")


@pytest.mark.skipif(COMPILER is None, reason="needs a C compiler (cc) to read the header's layout")
def test_every_field_of_the_interface_has_the_same_offset_and_size_in_c_and_rust(tmp_path: Path) -> None:
    rust = _native.shim_layout()
    assert {struct for struct, *_ in rust} == {"TFL_ShimInterface", "TFL_ShimDevice", "TFL_ShimKernel"}
    lines = [
        "#include <stdio.h>",
        '#include "torchfl_shim.h"',
        '#define F(T, f) printf("%s %s %zu %zu\\n", #T, #f, offsetof(T, f), sizeof(((T*)0)->f));',
        "int main(void) {",
        *(f"  F({struct}, {field})" for struct, field, _, _ in rust),
        '  printf("sizes %zu %zu %zu\\n", sizeof(TFL_ShimInterface), sizeof(TFL_ShimDevice), sizeof(TFL_ShimKernel));',
        "  return 0;",
        "}",
    ]
    source = tmp_path / "layout.c"
    source.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    includes = [arg for d in HEADER_DIRS for arg in ("-I", str(d))]
    subprocess.run(
        [str(COMPILER), "-std=c99", "-Wall", "-Wextra", "-Werror", *includes, str(source), "-o", str(exe)],
        check=True,
        timeout=120,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout.splitlines()
    c_view = [(s, f, int(o), int(n)) for s, f, o, n in (line.split() for line in out[:-1])]
    assert c_view == [tuple(row) for row in rust]
    # No field left out of the comparison: the last field ends where the struct does (all end 8-aligned).
    sizes = dict(zip(("TFL_ShimInterface", "TFL_ShimDevice", "TFL_ShimKernel"), map(int, out[-1].split()[1:])))
    for struct, size in sizes.items():
        last = [row for row in rust if row[0] == struct][-1]
        assert last[2] + last[3] == size, f"{struct} has fields after {last[1]} that the test does not compare"


def test_the_shim_and_the_core_speak_one_interface_version() -> None:
    header = (ROOT / "cpp_shim" / "include" / "torchfl_shim.h").read_text()
    assert f"#define TFL_SHIM_INTERFACE_VERSION {_C.INTERFACE_VERSION}\n" in header
    assert _C.INTERFACE_VERSION == _native.SHIM_INTERFACE_VERSION
    assert _C.TORCH_VERSION == _native.BUILT_TORCH_VERSION or _shim.loaded != torch_fl._paths.SHIM


def test_the_shim_is_the_module_torch_fl_C() -> None:
    import sys

    assert sys.modules["torch_fl._C"] is _C is torch_fl._C
    assert Path(_C.__file__) == _shim.loaded
    # The capsule is the only way in: its name is the header's.
    assert type(_C._shim_interface).__name__ == "PyCapsule"
    assert (
        'TFL_SHIM_CAPSULE_NAME "torch_fl._C._shim_interface"'
        in (ROOT / "cpp_shim" / "include" / "torchfl_shim.h").read_text()
    )


def test_the_core_refuses_anything_but_the_shims_capsule() -> None:
    with pytest.raises(RuntimeError, match=r"not the torch-fl shim's capsule"):
        _native.attach_shim(object())  # type: ignore[arg-type]


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils) to list the shim's exported symbols")
def test_the_shim_exports_no_function_but_its_module_init() -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(_shim.loaded)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    # Strong symbols only: weak ones are PyTorch's inline templates that its
    # headers mark visible, which every extension exports alike.
    exported = sorted(line.split()[-1] for line in out.splitlines() if line.split()[1] in {"T", "D", "B"})
    assert exported == ["PyInit__C"], exported
