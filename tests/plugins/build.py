"""Builds the test plugins: the fault-injection variants of tests/plugins/fixture_plugin.c, and others on base.h.

The Rust test suites build the same variants through the
``torchfl-testkit`` crate; this is the pytest side, with the system C
compiler (``$CC``, default ``cc``). Both take their flags from cflags.txt.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "plugins" / "fixture_plugin.c"
CFLAGS = ROOT / "tests" / "plugins" / "cflags.txt"


def cflags() -> list[str]:
    """The flags of cflags.txt, in order (paths relative to the repository root)."""
    lines = CFLAGS.read_text().splitlines()
    return [flag for line in lines if not line.lstrip().startswith("#") for flag in line.split()]


def compile_plugin(source: Path, out: Path, defines: Sequence[str] = ()) -> Path:
    """Compiles ``source`` (which includes base.h) into the shared library ``out``; returns ``out``."""
    cmd = [os.environ.get("CC", "cc"), *cflags(), *(f"-D{d}" for d in defines), str(source), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    return out


def build_fixture(out_dir: Path, variant: str, defines: Sequence[str] = ()) -> Path:
    """Compiles one variant (``-D`` for each define) and returns the library's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"libfixture_{variant}.so"
    if out.exists():
        return out
    return compile_plugin(SOURCE, out, defines)
