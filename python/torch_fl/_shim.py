"""Which C++ shim to load for the installed torch, building one on first use.

The shim links PyTorch's C++ API, which is not stable across releases: a
shim compiled against one torch release does not load under another (undefined
symbols). Everything else in torch-fl (the Rust core, the plugin ABI, the
Python package) is independent of the torch release. So one torch-fl wheel
serves every supported torch like this:

- the wheel bundles the shim built against the torch of its build
  environment (the pinned 2.14.1 for releases), used when that torch is
  installed;
- under another supported torch, the shim's C++ sources (bundled too) are
  compiled against the installed torch at the first import, once, into a
  per-user cache keyed by torch's exact build and location, the Python
  version and the sources' hash, with a progress message; later imports
  load the cached library.

Prebuilt shims for every supported torch in one wheel were the alternative:
no compiler needed at run time, but building the wheel would need every
torch release installed side by side (0.5-3 GB each) and the wheel would
still fail for local or nightly builds of a supported release. PyTorch's
own ``torch.utils.cpp_extension.load`` and Triton take the same
build-on-first-use route. ``TORCH_FL_SHIM_BUILD=0`` forbids the build (an
error says what to install instead); ``TORCH_FL_CACHE_DIR`` moves the cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

from . import _native, _paths, _shim_build, _versions

# The supported torch range: ``MIN_TORCH <= version < END_TORCH``, and the
# same as a pip requirement specifier. Stated once, in ``_versions``.
from ._versions import END_TORCH as END_TORCH
from ._versions import MIN_TORCH as MIN_TORCH
from ._versions import SPECIFIER as SPECIFIER

SHIM_NAME = _paths.SHIM.name

#: The shim this process loaded (set by :func:`load`).
loaded: Path | None = None


def installed_torch() -> str:
    """The installed torch's release, without a local suffix (``2.15.0`` for ``2.15.0+cu130``)."""
    return torch.__version__.split("+")[0]


def check_supported(version: str) -> None:
    """Raises ImportError naming the supported range when ``version`` is outside it."""
    if _versions.is_supported(version):
        return
    raise ImportError(
        f"torch-fl supports torch {_versions.describe()}, but torch {version} is installed. Install a supported torch "
        f'(pip install "torch{SPECIFIER}"), or a torch-fl release that supports torch {version}'
    )


def load() -> Path:
    """Imports the shim for the installed torch as ``torch_fl._C`` (once) and attaches the core to it.

    The shim is an extension module whose file lives in the package or in the
    cache of shims built for other torch releases, so it is imported from its
    path rather than found on ``sys.path``. Returns that path.
    """
    global loaded
    if loaded is None:
        path = locate()
        module = _import_extension(MODULE, path)
        try:
            # The core checks the table's version and size before it reads it.
            _native.attach_shim(module._shim_interface)
        except RuntimeError as e:
            raise ImportError(f"torch_fl's C++ shim {path} does not fit its Rust core: {e}") from e
        loaded = path
    return loaded


#: The shim's module name.
MODULE = "torch_fl._C"


def _import_extension(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:  # pragma: no cover - a file location always gives a spec
        raise ImportError(f"cannot import torch_fl's C++ shim from {path}")
    try:
        module = importlib.util.module_from_spec(spec)  # dlopen, and the shim's static registrations
        sys.modules[name] = module
        loader.exec_module(module)
    except ImportError as e:
        sys.modules.pop(name, None)
        raise ImportError(f"cannot load torch_fl's C++ shim {path}: {e}. Reinstall torch-fl") from e
    package, _, attr = name.rpartition(".")
    setattr(sys.modules[package], attr, module)
    return module


def locate() -> Path:
    """The shim for the installed torch: the bundled one, a cached build, or a new build."""
    built = _native.BUILT_TORCH_VERSION
    if built is None:
        raise ImportError(
            "torch_fl was built without its C++ shim (a plain `cargo build`?). Install the package with "
            "`pip install --no-build-isolation .` in an environment that has torch, or run `make demo`"
        )
    version = installed_torch()
    check_supported(version)
    if version == built and _paths.SHIM.exists():
        return _paths.SHIM
    return _cached_or_built(version, built)


def sources() -> Path:
    """The shim's C++ sources shipped in the package (copied there by build.rs)."""
    return _paths.LIB_DIR / "shim_src"


def _source_digest(src: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(src)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """Where shims built for other torch releases are kept (``TORCH_FL_CACHE_DIR`` overrides)."""
    given = os.environ.get("TORCH_FL_CACHE_DIR")
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "torch_fl"


def _cached_or_built(version: str, built: str) -> Path:
    src = sources()
    if not (src / "src").is_dir():
        raise ImportError(
            f"torch_fl was built against torch {built}, but torch {version} is installed, and this installation "
            f"has no shim sources to build for it ({src} is missing). Install torch=={built}, or reinstall "
            "torch-fl from a wheel or with `pip install --no-build-isolation --force-reinstall --no-deps .`"
        )
    # The exact torch build (a nightly and a release share a version string),
    # where it is installed (the shim links it by absolute rpath: each venv
    # gets its own) and the Python whose headers the shim includes.
    lib_dir = str(Path(torch.__file__).resolve().parent / "lib")
    where = hashlib.sha256(lib_dir.encode()).hexdigest()[:8]
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    key = f"torch-{version}-{torch.version.git_version[:12]}-abi{int(torch._C._GLIBCXX_USE_CXX11_ABI)}-{py}-{where}"
    target = cache_root() / "shim" / f"{key}-{_source_digest(src)}" / SHIM_NAME
    if target.exists():
        return target
    if os.environ.get("TORCH_FL_SHIM_BUILD", "1").strip() == "0":
        raise ImportError(
            f"torch_fl's bundled C++ shim is for torch {built}, torch {version} is installed, and "
            f"TORCH_FL_SHIM_BUILD=0 forbids building one for it (it would go to {target}). Unset "
            f"TORCH_FL_SHIM_BUILD to build it once, or install torch=={built}"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ImportError(
            f"torch_fl must build its C++ shim for torch {version} once, but cannot create {target.parent}: {e}. "
            "Point TORCH_FL_CACHE_DIR at a writable directory, or install "
            f"torch=={built}"
        ) from e
    with _locked(target.parent / ".lock"):
        if not target.exists():  # another process may have built it while we waited
            build(src, target, version)
    return target


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Ranks of one job import torch_fl at the same moment: one builds, the
    # others wait for it and load its result.
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compiler() -> str:
    """The C++ compiler (``CXX``, else ``c++``); ImportError saying what to do when there is none."""
    found = _shim_build.compiler()
    if found is None:
        raise ImportError(
            f"torch_fl needs to compile its C++ shim for the installed torch {installed_torch()} once, but no C++ "
            f"compiler was found ({os.environ.get('CXX') or 'c++'!r}; set CXX, or install one, e.g. "
            f"`apt install g++`). Alternatively install torch=={_native.BUILT_TORCH_VERSION}, for which the shim "
            "is prebuilt"
        )
    return found


def build(src: Path, target: Path, version: str) -> None:
    """Compiles the shim's sources in ``src`` against the installed torch into ``target``.

    The wheel's recipe (``_shim_build``), but warnings are not errors: a
    newer compiler or torch may warn where CI's did not. Raises ImportError
    with the compiler's output on failure.
    """
    compiler()
    files = len(_shim_build.translation_units(src))
    units = len(_shim_build.unity_groups(src))
    jobs = os.cpu_count() or 1
    _say(
        f"torch-fl: compiling its C++ shim for torch {version} (the bundled one is for torch "
        f"{_native.BUILT_TORCH_VERSION}): {files} files in {units} units on {jobs} cores, once per torch build, "
        f"into {target.parent}"
    )
    start = time.monotonic()
    torch_build = _shim_build.Torch.installed()
    try:
        _shim_build.build(
            src, target, torch=torch_build, werror=False, rpaths=[torch_build.lib_dir], jobs=jobs, progress=_progress
        )
    except _shim_build.BuildError as e:
        raise ImportError(_failed(version, str(e))) from e
    _say(f"torch-fl: shim for torch {version} built in {time.monotonic() - start:.0f} s")


def _failed(version: str, detail: str) -> str:
    return (
        f"torch-fl: compiling its C++ shim for torch {version} failed. Install "
        f"torch=={_native.BUILT_TORCH_VERSION} (the shim is prebuilt for it), or report this with the output of "
        f"`python -m torch_fl info`. Compiler output for {detail}"
    )


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r  compiled {done}/{total}" + ("\n" if done == total else ""))
        sys.stderr.flush()
