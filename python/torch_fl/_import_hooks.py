"""Running code right after a module is imported, without importing it.

Registration must hook into parts of PyTorch that are slow to import
(Dynamo: seconds) and that most programs never use. A finder placed first
on ``sys.meta_path`` lets the normal finders locate the module, then wraps
its loader so the callback runs once the module has executed; the module
ends up with its own loader, as if nothing had intervened.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType

Callback = Callable[[ModuleType], None]

_lock = threading.Lock()


def when_imported(name: str, callback: Callback) -> None:
    """Calls ``callback(module)`` once module ``name`` is imported: now if it is, else right after its import.

    The callback runs once. An exception it raises becomes a warning: a
    hook must never break the import of someone else's module.
    """
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            sys.meta_path.insert(0, _AfterImportFinder(name, callback))
            return
    _run(callback, module)


def _run(callback: Callback, module: ModuleType) -> None:
    try:
        callback(module)
    except Exception as e:  # reported, never raised into the importer
        warnings.warn(f"torch-fl: a hook on the import of {module.__name__} failed: {e!r}", stacklevel=2)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callback) -> None:
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _CallbackLoader(spec.loader, self)
                return spec
        return None

    def loaded(self, module: ModuleType, loader: importlib.abc.Loader) -> None:
        # Only a successful import consumes the hook: after a failed one, the
        # next attempt is hooked again.
        module.__loader__ = loader
        if module.__spec__ is not None:
            module.__spec__.loader = loader
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        _run(self.callback, module)


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, finder: _AfterImportFinder) -> None:
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.finder.loaded(module, self.loader)
