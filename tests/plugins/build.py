"""Builds the fault-injection plugins of tests/plugins/fixture_plugin.c.

The Rust test suites build the same variants through the
``torchfl-testkit`` crate; this is the pytest side, with the system C
compiler (``$CC``, default ``cc``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "plugins" / "fixture_plugin.c"
INCLUDES = [ROOT / "crates" / "torchfl-ffi" / "include", ROOT / "examples" / "c_plugin"]


def build_fixture(out_dir: Path, variant: str, defines: Sequence[str] = ()) -> Path:
    """Compiles one variant (``-D`` for each define) and returns the library's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"libfixture_{variant}.so"
    if out.exists():
        return out
    cmd = [os.environ.get("CC", "cc"), "-std=c99", "-O1", "-fPIC", "-shared", "-Wall", "-Werror"]
    cmd += [f"-I{p}" for p in INCLUDES]
    cmd += [f"-D{d}" for d in defines]
    cmd += [str(SOURCE), "-o", str(out), "-lpthread"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out
