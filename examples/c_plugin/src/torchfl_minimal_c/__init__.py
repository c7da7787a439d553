"""The minimal_c torch-fl plugin package: the ``torch_fl.plugins`` entry point's object."""

from __future__ import annotations

from pathlib import Path


def plugin() -> dict[str, object]:
    """The plugin library's path for torch-fl's discovery (priority 0, no options)."""
    here = Path(__file__).resolve().parent
    libraries = sorted(here.glob("_plugin*.so"))
    if not libraries:
        raise FileNotFoundError(f"the minimal_c plugin library is missing from {here}: reinstall torchfl-minimal-c")
    return {"path": str(libraries[0]), "priority": 0, "options": ""}
