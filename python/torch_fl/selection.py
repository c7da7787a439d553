"""Which installed plugin package ``import torch`` brings up: one image, every chip.

An image may carry several plugin packages (one per accelerator it may run
on); the instance's hardware decides which device autoload registers.
:func:`autoload_choice` considers the packages by priority (the entry
point's ``"priority"``, highest first; ties by device name) and picks the
first whose hardware is present, asking each plugin without initializing
it: ABI 1.6's optional ``probe_devices`` entry runs only the vendor runtime's
device enumeration (no contexts, memory or kernel builds). A plugin with no
device, or whose driver is missing, is passed over with its reason; one
without the entry cannot tell without initializing and is taken to have its
hardware. The simulator is never chosen unless named (``TORCH_FL_DEVICE=sim``).

``TORCH_FL_DEVICE`` names the device outright and nothing is probed. With a
single plugin package installed, autoload takes it without probing (its
first use says what is missing, if anything); ``python -m torch_fl info``
shows every candidate and why it was or was not chosen.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import _native, plugins

__all__ = ["AutoloadCandidate", "AutoloadChoice", "autoload_choice"]

#: The bundled simulator's device name: autoload never picks it by itself.
SIMULATOR = "sim"


@dataclass(frozen=True)
class AutoloadCandidate:
    """One plugin package as autoload saw it.

    Attributes:
        name: the device name (the entry point's name).
        package: the distribution declaring it (``"torchfl-opencl 0.1.0"``).
        priority: the priority the package asks for.
        devices: the devices the plugin counted without initializing; ``None``
            when it could not tell (no ``probe_devices`` entry) or was not asked.
        chosen: whether autoload registers this one.
        reason: why it was chosen or passed over (or not considered).
    """

    name: str
    package: str
    priority: int
    devices: int | None
    chosen: bool
    reason: str


@dataclass(frozen=True)
class AutoloadChoice:
    """What autoload decided.

    Attributes:
        device: the device to register, or ``None`` for none.
        why: how it was decided (``TORCH_FL_DEVICE``, the only package, or
            by hardware and priority).
        candidates: every plugin package, in the order considered.
    """

    device: str | None
    why: str
    candidates: list[AutoloadCandidate]


def _probe(package: plugins.PackagedPlugin) -> tuple[int | None, str | None]:
    """The devices the package's plugin counts, and why it cannot be chosen (``None`` if it can)."""
    if package.error is not None or package.path is None:
        return None, f"its entry point cannot be used: {package.error or 'no library path'}"
    try:
        count = _native.probe_devices(package.path, package.options)
    except Exception as e:  # a broken or driverless plugin is passed over, never fatal
        return None, f"{type(e).__name__}: {e}"
    if count is None:
        return None, None
    if count == 0:
        return 0, "no device present (the plugin counted none)"
    return count, None


def _order(found: list[plugins.PackagedPlugin]) -> list[plugins.PackagedPlugin]:
    return sorted(found, key=lambda p: (-p.priority, p.name))


def autoload_choice(probe_all: bool = False) -> AutoloadChoice:
    """The device ``import torch`` brings up, and every candidate with its reason.

    Args:
        probe_all: probe every package (what ``python -m torch_fl info``
            shows); by default probing stops at the first package chosen,
            and the ones after it are reported as not considered.
    """
    found = _order(plugins.packaged_plugins())
    named = os.environ.get("TORCH_FL_DEVICE", "").strip()
    if named:
        candidates = [
            AutoloadCandidate(
                p.name,
                p.package,
                p.priority,
                None,
                p.name == named,
                "named by TORCH_FL_DEVICE" if p.name == named else f"TORCH_FL_DEVICE names {named!r}",
            )
            for p in found
        ]
        return AutoloadChoice(named, "named by TORCH_FL_DEVICE", candidates)
    if len(found) == 1 and found[0].name != SIMULATOR:
        # Taken without probing, as before there were several: its first
        # use says what is missing, if anything. `info` still shows the probe.
        only = found[0]
        devices, passed_over = _probe(only) if probe_all else (None, None)
        seen = f" (probed: {passed_over or (f'{devices} device(s)' if devices is not None else 'cannot tell')})"
        reason = "the only plugin package, taken without probing" + (seen if probe_all else "")
        candidate = AutoloadCandidate(only.name, only.package, only.priority, devices, True, reason)
        return AutoloadChoice(only.name, "the only plugin package", [candidate])
    chosen: str | None = None
    candidates = []
    for p in found:
        if p.name == SIMULATOR:
            candidates.append(
                AutoloadCandidate(p.name, p.package, p.priority, None, False, "the simulator is used only when named")
            )
            continue
        if chosen is not None and not probe_all:
            candidates.append(
                AutoloadCandidate(p.name, p.package, p.priority, None, False, f"not probed: {chosen!r} comes first")
            )
            continue
        devices, passed_over = _probe(p)
        if passed_over is not None:
            candidates.append(AutoloadCandidate(p.name, p.package, p.priority, devices, False, passed_over))
            continue
        present = f"{devices} device(s)" if devices is not None else "devices assumed present (no probe_devices entry)"
        if chosen is None:
            chosen = p.name
            candidates.append(
                AutoloadCandidate(
                    p.name, p.package, p.priority, devices, True, f"chosen: {present}, priority {p.priority}"
                )
            )
        else:
            candidates.append(
                AutoloadCandidate(
                    p.name, p.package, p.priority, devices, False, f"{present}, but {chosen!r} comes first by priority"
                )
            )
    if not found:
        why = "no plugin package is installed"
    elif chosen is None:
        why = "no plugin package has its hardware present"
    else:
        why = "by the hardware present and priority"
    return AutoloadChoice(chosen, why, candidates)
