"""The CPU fallback: its mode, its statistics and its report at exit.

An operator that no plugin kernel serves runs on the CPU (the C++ shim's
boxed fallback copies its inputs to the host and its results back) or,
in ``"error"`` mode, raises. The shim keeps the mode and counts every
fallen-back call; this module is the Python face of both.

``TORCH_FL_FALLBACK`` sets the initial mode (the shim reads it as it
loads). ``TORCH_FL_LOG``, a comma-separated list of topics, turns on opt-in
diagnostics:

- ``fallback``: when the process exits, print which operators ran on the
  CPU fallback and how often (the same figures as :func:`fallback_stats`),
  most frequent first;
- ``plugin``: also show plugins' debug and info messages (warnings and
  errors are always shown; handled by the Rust core);
- ``all``: everything.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections import Counter
from typing import TextIO

from . import _C

__all__ = ["fallback_mode", "fallback_stats", "reset_fallback_stats", "set_fallback_mode"]

# Collectives the "tfl" c10d backend staged through the host (plugins
# without collectives): counted here, beside the shim's operator counts.
_distributed_counts: Counter[str] = Counter()
_distributed_lock = threading.Lock()


def count_distributed(op: str) -> None:
    """Counts one staged collective, e.g. ``"c10d::allreduce (staged)"``."""
    with _distributed_lock:
        _distributed_counts[op] += 1


def _counts() -> dict[str, int]:
    with _distributed_lock:
        return {**_C.fallback_counts(), **_distributed_counts}


def fallback_stats() -> dict[str, int]:
    """Return how often each operator fell back to the CPU.

    ``TORCH_FL_LOG=fallback`` prints the same figures when the process exits.

    Returns:
        ``{operator: calls}`` for operators no plugin kernel serves, counted
        since the start or the last :func:`reset_fallback_stats`, and the
        collectives staged through the host (``"c10d::allreduce (staged)"``).
    """
    return dict(sorted(_counts().items()))


def reset_fallback_stats() -> None:
    """Clear :func:`fallback_stats` and the once-per-operator warnings."""
    _C.reset_fallback_counts()
    with _distributed_lock:
        _distributed_counts.clear()


def set_fallback_mode(mode: str) -> None:
    """Choose what happens to operators no plugin implements.

    Args:
        mode: ``"cpu"`` runs them on the CPU and warns once per operator;
            ``"error"`` raises ``NotImplementedError`` naming the kernel
            symbol a plugin would export. The initial mode comes from the
            ``TORCH_FL_FALLBACK`` environment variable.
    """
    _C.set_fallback_mode(mode)


def fallback_mode() -> str:
    """Return the current fallback mode, ``"cpu"`` or ``"error"``."""
    return _C.fallback_mode()


def log_topics() -> set[str]:
    """Return the topics named in ``TORCH_FL_LOG``."""
    return {t.strip().lower() for t in os.environ.get("TORCH_FL_LOG", "").split(",") if t.strip()}


def report(file: TextIO | None = None) -> None:
    """Print the fallback counts, most frequent first (``TORCH_FL_LOG=fallback`` at exit)."""
    out = file if file is not None else sys.stderr
    counts = sorted(_counts().items(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(n for _, n in counts)
    print(f"[torch-fl] CPU fallback: {total} calls of {len(counts)} operators", file=out)
    for op, n in counts:
        print(f"[torch-fl]   {n:8d}  {op}", file=out)


def install() -> None:
    """Act on ``TORCH_FL_LOG`` (called once, when torch_fl is imported)."""
    if log_topics() & {"fallback", "all"}:
        atexit.register(report)
