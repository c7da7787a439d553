"""``TORCH_FL_LOG``: opt-in diagnostics, a comma-separated list of topics.

- ``fallback``: when the process exits, print which operators ran on the
  CPU fallback and how often (the same figures as
  :func:`torch_fl.fallback_stats`), most frequent first;
- ``plugin``: also show plugins' debug and info messages (warnings and
  errors are always shown; handled by the Rust core);
- ``all``: everything.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import TextIO

from . import _native


def topics() -> set[str]:
    """Return the topics named in ``TORCH_FL_LOG``."""
    return {t.strip().lower() for t in os.environ.get("TORCH_FL_LOG", "").split(",") if t.strip()}


def fallback_report(file: TextIO | None = None) -> None:
    """Print the fallback counts, most frequent first."""
    out = file if file is not None else sys.stderr
    counts = sorted(_native.fallback_counts().items(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(n for _, n in counts)
    print(f"[torch-fl] CPU fallback: {total} calls of {len(counts)} operators", file=out)
    for op, n in counts:
        print(f"[torch-fl]   {n:8d}  {op}", file=out)


def install() -> None:
    """Act on ``TORCH_FL_LOG`` (called once, at import)."""
    wanted = topics()
    if wanted & {"fallback", "all"}:
        atexit.register(fallback_report)
