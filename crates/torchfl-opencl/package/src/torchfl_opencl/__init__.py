"""The OpenCL torch-fl plugin package: the ``torch_fl.plugins`` entry point's object.

Nothing here imports torch or opens OpenCL: torch-fl reads :func:`plugin`'s
answer, probes the library for devices and initializes it at first use.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["plugin"]

#: Above a plain package's 0: where several plugin packages are installed and
#: this one finds an OpenCL device, autoload prefers it to a plugin that asks
#: for less.
PRIORITY = 10


def plugin() -> dict[str, object]:
    """The plugin library's path, priority and options for torch-fl's discovery."""
    library = Path(__file__).resolve().parent / "libtorchfl_opencl.so"
    if not library.is_file():
        raise FileNotFoundError(f"the OpenCL plugin library is missing from {library.parent}: reinstall torchfl-opencl")
    return {"path": str(library), "priority": PRIORITY, "options": ""}
