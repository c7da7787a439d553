"""torch-fl's ``torch.backends`` entry point: ``import torch`` alone makes a plugin device usable.

PyTorch calls :func:`autoload` at the end of ``import torch`` (unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). It lives in this tiny top-level
package, not in ``torch_fl``, so that the common case (nothing to load) costs
one entry-point scan and no import of torch-fl. The device is named by
``TORCH_FL_DEVICE``, or is the one installed plugin package, or, with
several, the one of highest priority whose hardware is present
(:mod:`torch_fl.selection`; the bundled ``sim`` only when named);
``TORCH_FL_AUTOLOAD=0`` turns this off. The plugin
is not initialized here: see :mod:`torch_fl.autoload`.

Whatever goes wrong becomes one warning, never an exception: PyTorch would
turn it into a failed ``import torch``.
"""

from __future__ import annotations

import os
import warnings

__all__ = ["autoload"]

ENTRY_POINT_GROUP = "torch_fl.plugins"


def _choose_device() -> str | None:
    device = os.environ.get("TORCH_FL_DEVICE", "").strip()
    if device:
        return device
    from importlib.metadata import entry_points

    names = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})
    if not names:
        return None
    if len(names) == 1 and names[0] != "sim":
        return names[0]
    # Several packages (one image for several kinds of instance): the
    # hardware present decides, asked without initializing any plugin. (A
    # lone simulator package comes here too: the simulator only when named.)
    from torch_fl.selection import autoload_choice

    choice = autoload_choice()
    if choice.device is None and len(names) > 1:
        reasons = "; ".join(f"{c.name}: {c.reason}" for c in choice.candidates)
        warnings.warn(
            f"torch-fl: several plugin packages are installed ({', '.join(names)}) and none has its hardware "
            f"present, so none is loaded automatically ({reasons}): set TORCH_FL_DEVICE to the one to use, or call "
            "torch_fl.register_device_plugin(name=...)",
            RuntimeWarning,
            stacklevel=2,
        )
    return choice.device


def autoload() -> None:
    """Prepares the chosen plugin device; warns instead of raising."""
    if os.environ.get("TORCH_FL_AUTOLOAD", "1").strip() == "0":
        return
    try:
        device = _choose_device()
        if device is None:
            return
        from torch_fl import autoload as prepare

        prepare.prepare(device)
    except Exception as e:  # import torch must never fail because of a plugin
        warnings.warn(
            f"torch-fl: autoloading a plugin device failed, so it is absent: {type(e).__name__}: {e}. "
            "Set TORCH_FL_AUTOLOAD=0 to stop trying",
            RuntimeWarning,
            stacklevel=2,
        )
