"""Plugins installed as Python packages, and the list of every plugin torch-fl can find.

A vendor publishes a plugin as a package that depends on ``torch-fl`` (not
on torch), ships the plugin's shared library, and declares an entry point in
the group ``torch_fl.plugins`` whose name is the device name::

    [project.entry-points."torch_fl.plugins"]
    acme = "acme_torchfl:plugin"

The object is a function (called with no arguments) or a value, giving the
library's path (``str`` or ``os.PathLike``) or a mapping
``{"path": ..., "priority": 0, "options": "key=value;..."}``. Nothing else of
the package is imported. ``examples/c_plugin`` is a complete one.

Discovery order for ``register_device_plugin(name)`` without a path:
``TORCH_FL_PLUGIN_PATH``, libraries already loaded in the process, entry
points named ``name`` (in the order ``importlib.metadata`` lists them), then
the bundled simulated accelerator for ``"sim"``.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from . import _native, _paths
from .errors import PluginWarning

__all__ = ["ENTRY_POINT_GROUP", "PackagedPlugin", "PluginListing", "list_plugins", "packaged_plugins"]

#: The entry-point group plugin packages declare.
ENTRY_POINT_GROUP = "torch_fl.plugins"


@dataclass(frozen=True)
class PackagedPlugin:
    """A plugin package's entry point, resolved (or why it could not be).

    Attributes:
        name: the device name (the entry point's name).
        package: the distribution that declares it (``"acme-torchfl 1.0"``).
        entry_point: ``"module:object"`` as declared.
        path: the plugin library, or ``None`` when resolving failed.
        priority: the priority the package asks for (``register_device_plugin``
            uses it when the caller gives none).
        options: plugin options passed to its ``initialize``.
        error: why the entry point could not be resolved, or ``None``.
    """

    name: str
    package: str
    entry_point: str
    path: str | None = None
    priority: int = 0
    options: str = ""
    error: str | None = None


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "an unknown package"
    return f"{dist.metadata['Name']} {dist.version}"


def _resolve(ep: EntryPoint) -> PackagedPlugin:
    """Loads and calls one entry point; any failure becomes ``error``."""
    base = PackagedPlugin(name=ep.name, package=_distribution(ep), entry_point=ep.value)
    try:
        obj = ep.load()
        value = obj() if callable(obj) else obj
    except Exception as e:  # a broken package must never break discovery
        return _with(base, error=f"loading {ep.value} failed: {type(e).__name__}: {e}")
    spec: Mapping[str, object] = value if isinstance(value, Mapping) else {"path": value}
    path, priority, options = spec.get("path"), spec.get("priority", 0), spec.get("options", "")
    if not isinstance(path, (str, os.PathLike)):
        return _with(base, error=f"{ep.value} returned {value!r}; expected a library path or {{'path': ...}}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not isinstance(options, str):
        return _with(base, error=f"{ep.value} returned priority={priority!r}, options={options!r}: expected int, str")
    library = os.fspath(path)
    if not Path(library).is_file():
        return _with(base, path=str(library), error=f"{ep.value} names {library}, which is not a file")
    return _with(base, path=str(library), priority=priority, options=options)


def _with(base: PackagedPlugin, **changes: Any) -> PackagedPlugin:
    return dataclasses.replace(base, **changes)


def packaged_plugins(name: str | None = None) -> list[PackagedPlugin]:
    """The installed plugin packages' entry points (only ``name``'s when given), resolved.

    Never raises for a broken package: its :attr:`PackagedPlugin.error` says
    what is wrong.
    """
    found = entry_points(group=ENTRY_POINT_GROUP)
    return [_resolve(ep) for ep in found if name is None or ep.name == name]


def describe(plugin: PackagedPlugin) -> str:
    """How discovery names a package as the origin of a plugin."""
    return f"the plugin package {plugin.package} (entry point {plugin.name} = {plugin.entry_point})"


def discovery_candidates(name: str) -> list[tuple[str, str, str, str]]:
    """Candidates after ``TORCH_FL_PLUGIN_PATH`` and preloaded libraries: packages, then the bundled plugin.

    A package whose entry point cannot be resolved is skipped with a
    :class:`~torch_fl.PluginWarning` naming the package and the cause.
    """
    candidates = []
    for p in packaged_plugins(name):
        if p.path is None or p.error is not None:
            warnings.warn(
                f"plugin package {p.package} (entry point {p.name} = {p.entry_point}) is skipped: {p.error}",
                PluginWarning,
                stacklevel=3,
            )
            continue
        candidates.append((p.name, p.path, describe(p), p.options))
    return candidates + _paths.bundled_candidates()


@dataclass(frozen=True)
class PluginListing:
    """One plugin :func:`list_plugins` found.

    Attributes:
        name: the plugin's name (from its identity), or the entry point's
            name when it could not be read.
        source: where it was found: ``"TORCH_FL_PLUGIN_PATH"``, ``"package
            <dist> (entry point ...)"`` or ``"bundled"``.
        path: the library.
        abi_version: the ABI version the plugin declares, or ``None``.
        status: ``"registered"`` (bound to this process' device),
            ``"initialized"``, ``"available"``, or ``"error"``.
        detail: vendor and version, or the error message.
        info: everything the plugin's identity says.
    """

    name: str
    source: str
    path: str
    abi_version: str | None
    status: str
    detail: str
    info: dict[str, str] = field(default_factory=dict)


def list_plugins() -> list[PluginListing]:
    """Every plugin torch-fl can find, without initializing any.

    Each library is opened and validated (its identity and op table read,
    ``initialize`` not called) so that the ABI version and problems show.
    Sources, in discovery order: ``TORCH_FL_PLUGIN_PATH``, plugin packages,
    the bundled simulated accelerator.

    Example::

        import torch_fl
        for p in torch_fl.list_plugins():
            print(p.name, p.source, p.abi_version, p.status)
    """
    sources: list[tuple[str | None, str, str | None, str | None]] = [
        (None, "TORCH_FL_PLUGIN_PATH", path, None) for path in _native.plugin_path_files()
    ]
    for p in packaged_plugins():
        sources.append((p.name, f"package {p.package} (entry point {p.name} = {p.entry_point})", p.path, p.error))
    for name, path, _description, _options in _paths.bundled_candidates():
        sources.append((name, "bundled", path, None))
    bound = {plugin.label for plugin in _native.bound_plugins()}
    return [_probe(name, source, path, error, bound) for name, source, path, error in sources]


def _probe(name: str | None, source: str, path: str | None, error: str | None, bound: set[str]) -> PluginListing:
    if path is None or error is not None:
        return PluginListing(name or "?", source, path or "", None, "error", error or "no library path")
    try:
        info = _native.probe_plugin(path)
    except Exception as e:  # listing reports every plugin, broken ones included
        return PluginListing(name or Path(path).name, source, path, None, "error", f"{type(e).__name__}: {e}")
    label = f"'{info['name']}' ({path})"
    status = "registered" if label in bound else ("initialized" if info["initialized"] == "yes" else "available")
    detail = f"{info['vendor']}, {info['chip_family']}, version {info['plugin_version']}, {info['ops']} operators"
    return PluginListing(info["name"], source, path, info["abi_version"], status, detail, info)
