"""Where the package's native libraries are."""

from __future__ import annotations

from pathlib import Path

LIB_DIR = Path(__file__).resolve().parent / "_lib"
SHIM = LIB_DIR / "libtorchfl_shim.so"
SIM_PLUGIN = LIB_DIR / "libtorchfl_sim.so"


def bundled_candidates() -> list[tuple[str, str, str, str]]:
    """Discovery candidates shipped with the package: (name, path, description, options)."""
    return [("sim", str(SIM_PLUGIN), "the bundled simulated accelerator", "")]
