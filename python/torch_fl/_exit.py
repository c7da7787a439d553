"""A clean interpreter exit after backward passes on a plugin device.

PyTorch runs the backward pass of a device's operators on an autograd
worker thread per device, and since 2.x every backward stashes a Python
object (a ``contextvars`` context) in the thread-local state that the graph
task captures. When the worker thread drops the last reference to a
finished graph task, destroying that object needs the GIL. If the script
ends right after ``backward()``, the main thread may already be finalizing
the interpreter; the worker then exits inside a C++ destructor and the
process aborts with "terminate called without an active exception".

At exit, before finalization starts, releasing the GIL for a moment lets
such a worker finish its release (it is already waiting for the GIL, or a
few microseconds away from it).
"""

from __future__ import annotations

import atexit
import time

_installed = False


def _let_autograd_workers_finish() -> None:
    for _ in range(3):
        time.sleep(0.001)


def install() -> None:
    """Register the exit handler once per process."""
    global _installed
    if not _installed:
        atexit.register(_let_autograd_workers_finish)
        _installed = True
