"""Every environment variable torch-fl reads, in one table.

This table is the documentation's source of truth: ``python -m torch_fl
info`` prints every variable in it (with its value when set), and the
README's table under "Configuration" is generated from it
(``python tools/gen_env_table.py``). ``tests/test_env_registry.py`` fails
when the README disagrees with the table, or when the code (``python/``,
``crates/*/src``, ``crates/*/build.rs``, ``cpp_shim/``) names a
``TORCH_FL_*`` or ``TORCHFL_*`` variable the table does not list.

The code that reads a variable reads it where it is (Python, the Rust core
and simulator, the C++ shim); the table says who does, with these words:

- ``package``: the ``torch_fl`` Python package;
- ``autoload``: the ``torch.backends`` hook PyTorch calls at ``import torch``
  (``torchfl_autoload``);
- ``core``: the Rust core (discovery, loading, logging);
- ``shim``: the C++ shim inside PyTorch's dispatcher;
- ``simulator``: the simulated accelerator plugin;
- ``torchfl-abi``: the plugin checking tool;
- ``build``: building the package (``make install``, ``pip install``);
- ``torch``: PyTorch itself (listed where it changes what torch-fl does).

This module imports nothing from torch-fl or torch, so tools load it from
its file without the package being built.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["READERS", "VARIABLES", "Variable", "by_name", "names"]

#: The readers, in the order tables list them, each with what it is.
READERS = {
    "package": "the `torch_fl` Python package",
    "autoload": "the hook PyTorch calls at `import torch` (`torchfl_autoload`)",
    "core": "the Rust core",
    "shim": "the C++ shim",
    "simulator": "the simulated accelerator",
    "opencl": "the OpenCL plugin (`crates/torchfl-opencl`)",
    "torchfl-abi": "the plugin checking tool",
    "build": "building the package (`make install`, `pip install`)",
    "torch": "PyTorch itself",
}


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, default, readers and meaning.

    Attributes:
        name: the variable, e.g. ``TORCH_FL_LOG``.
        default: what applies while it is unset (Markdown, short).
        readers: who reads it (keys of :data:`READERS`).
        meaning: what it does, one line of Markdown.
    """

    name: str
    default: str
    readers: tuple[str, ...]
    meaning: str


_SIM_OPTION = "plugin option `{}`"

#: Every variable torch-fl reads (and the two PyTorch variables that change
#: what it does), in the order the README and ``torch_fl info`` list them.
VARIABLES: tuple[Variable, ...] = (
    # -- Finding and loading plugins ------------------------------------------
    Variable(
        "TORCH_FL_PLUGIN_PATH",
        "unset",
        ("core",),
        "`:`-separated plugin files and directories searched by name (first, before preloaded libraries and "
        "plugin packages)",
    ),
    Variable(
        "TORCH_FL_ALLOW_WRITABLE_PLUGINS",
        "`0`",
        ("core",),
        "`1`: load plugin files other users can write (world-writable, or in a world-writable directory "
        "without the sticky bit), which are refused by default as SSH refuses such keys",
    ),
    Variable(
        "TORCH_FL_DEVICE",
        "the one installed plugin package; with several, the one of highest priority whose hardware is present",
        ("autoload",),
        "the device `import torch` makes usable (autoload), e.g. `sim` or an installed plugin package's name",
    ),
    Variable(
        "TORCH_FL_AUTOLOAD",
        "`1`",
        ("autoload",),
        "`0`: no autoload at `import torch`",
    ),
    Variable(
        "TORCH_DEVICE_BACKEND_AUTOLOAD",
        "`1`",
        ("torch",),
        "PyTorch's switch for every `torch.backends` entry point: `0` turns torch-fl's autoload off too",
    ),
    Variable(
        "TORCH_FL_INIT_TIMEOUT",
        "`60`",
        ("core",),
        "seconds `register_device_plugin` waits for a plugin to load and initialize (`0`: no limit); then "
        "`PluginInitTimeoutError` names the plugin and the call it is stuck in, and its thread is left behind",
    ),
    Variable(
        "TORCH_FL_CRASH_REPORT",
        "`1`",
        ("core",),
        "`0`: install no fatal-signal handler (by default a plugin that crashes or exits the process is named "
        "in the last line printed)",
    ),
    # -- Running on the device ------------------------------------------------
    Variable(
        "TORCH_FL_ALLOC_CONF",
        "`backend:caching`",
        ("shim",),
        "`backend:caching`: device memory goes through torch-fl's caching allocator; `backend:plugin`: every "
        "tensor allocation is a plugin call",
    ),
    Variable(
        "TORCH_FL_GRAPHS",
        "`auto`",
        ("shim",),
        "How device graphs replay: `auto` as one launch of the plugin's native graph where it offers ABI 1.7 "
        "graphs, else kernel by kernel from torch-fl's recording; `shim` always the latter; `native` requires "
        "the former. Read at each graph's instantiation",
    ),
    Variable(
        "PYTORCH_ALLOC_CONF",
        "unset",
        ("torch",),
        "PyTorch's keys `max_split_size_mb`, `roundup_power2_divisions`, `max_non_split_rounding_mb` and "
        "`garbage_collection_threshold` tune torch-fl's caching allocator",
    ),
    Variable(
        "TORCH_FL_FALLBACK",
        "`cpu`",
        ("shim",),
        "`cpu`: operators no plugin implements run on the CPU, warning once; `error`: raise instead",
    ),
    Variable(
        "TORCH_FL_TRACE",
        "unset",
        ("package",),
        "a file to write the device trace of the whole run to at exit (`torch_fl.trace`); `{pid}` and "
        "`{rank}` are replaced",
    ),
    Variable(
        "TORCH_FL_TRACE_REPORT",
        "unset",
        ("package",),
        "a file to write the per-operator report of the plugin's native calls and device times of the whole run "
        "to at exit (`DeviceTrace.native_report`; what `python -m torch_fl trace` prints); `{pid}` and `{rank}` "
        "are replaced",
    ),
    Variable(
        "TORCH_FL_LOG",
        "unset",
        ("package", "core"),
        "comma-separated topics: `fallback` prints the CPU-fallback counts per operator at exit; `plugin` "
        "shows plugins' debug and info messages (warnings always show); `all`",
    ),
    # -- The C++ shim under another torch -------------------------------------
    Variable(
        "TORCH_FL_SHIM_BUILD",
        "`1`",
        ("package",),
        "`0`: never compile the C++ shim at import; under a supported torch other than the one the package "
        "was built for, `import torch_fl` then fails, naming what to install",
    ),
    Variable(
        "TORCH_FL_CACHE_DIR",
        "`$XDG_CACHE_HOME/torch_fl`, else `~/.cache/torch_fl`",
        ("package",),
        "where shims compiled for other torch releases are kept",
    ),
    # -- torch.distributed ----------------------------------------------------
    Variable(
        "TORCH_FL_DIST_STAGED",
        "`0`",
        ("package",),
        '`1`: the `"tfl"` distributed backend stages collectives through host memory and gloo even when the '
        "plugin has collectives",
    ),
    Variable(
        "TORCH_FL_DIST_CHECK",
        "`1` staged, `0` native",
        ("package",),
        "`1`/`0`: compare each collective's op, dtype and shape across ranks first (default: on for the "
        "staged path, off for the plugin's collectives)",
    ),
    Variable(
        "TORCH_FL_DIST_NONBLOCKING",
        "`0`",
        ("package",),
        "`1`: create the plugin's communicators without waiting for the other ranks to join (NCCL's "
        "non-blocking communicators); their first collective waits instead",
    ),
    # -- The simulated accelerator --------------------------------------------
    Variable(
        "TORCH_FL_SIM_DEVICES",
        "`2`",
        ("simulator",),
        "simulated devices, `0` to `64`; " + _SIM_OPTION.format("devices"),
    ),
    Variable(
        "TORCH_FL_SIM_MEMORY",
        "`16GiB`",
        ("simulator",),
        "capacity per simulated device (an accounting limit): bytes, `512MiB`, `4GiB`; " + _SIM_OPTION.format("memory"),
    ),
    Variable(
        "TORCH_FL_SIM_MODE",
        "`async`",
        ("simulator",),
        "`async`: a worker thread per stream; `sync`: all stream work runs inline, so a failing kernel fails "
        "the call that launched it; " + _SIM_OPTION.format("mode"),
    ),
    Variable(
        "TORCH_FL_SIM_STRICT",
        "`0`",
        ("simulator",),
        "`1`: tagged device pointers the host cannot dereference, so host code touching device memory crashes "
        "at once; " + _SIM_OPTION.format("strict"),
    ),
    Variable(
        "TORCH_FL_SIM_SOCKET_IFNAME",
        "the interface routing to `MASTER_ADDR` (loopback when local)",
        ("simulator",),
        "the interface the simulator's collectives listen on, in `NCCL_SOCKET_IFNAME`'s syntax: `eth0`, a "
        "prefix list `eth,ens`, an exact name `=eth0`, or exclusions `^docker,lo`",
    ),
    Variable(
        "TORCH_FL_SIM_COLL_TIMEOUT",
        "the process group's `timeout`",
        ("simulator",),
        "seconds; overrides the process group's timeout for the simulator's communicators",
    ),
    Variable(
        "TORCH_FL_SIM_COST_MODEL",
        "`off`",
        ("simulator",),
        "the simulator's cost model (below): `off` or `pcie-gpu` (a discrete GPU on PCIe 4.0 x16); "
        + _SIM_OPTION.format("cost_model"),
    ),
    Variable(
        "TORCH_FL_SIM_ALLOC_LATENCY_US",
        "the cost model's",
        ("simulator",),
        "µs of host time per `allocate` and per `deallocate`; " + _SIM_OPTION.format("alloc_latency_us"),
    ),
    Variable(
        "TORCH_FL_SIM_ALLOC_SYNC",
        "the cost model's",
        ("simulator",),
        "`1`: allocate/free first wait for the device to go idle, as `cudaMalloc`/`cudaFree` do; "
        + _SIM_OPTION.format("alloc_sync"),
    ),
    Variable(
        "TORCH_FL_SIM_LAUNCH_LATENCY_US",
        "the cost model's",
        ("simulator",),
        "µs of host time per kernel launch, copy or memset enqueue; " + _SIM_OPTION.format("launch_latency_us"),
    ),
    Variable(
        "TORCH_FL_SIM_COPY_LATENCY_US",
        "the cost model's",
        ("simulator",),
        "µs of device time per host↔device copy, on top of bytes over bandwidth; "
        + _SIM_OPTION.format("copy_latency_us"),
    ),
    Variable(
        "TORCH_FL_SIM_PINNED_GBPS",
        "the cost model's",
        ("simulator",),
        "GB/s from/to pinned host memory (`0`: free); " + _SIM_OPTION.format("pinned_gbps"),
    ),
    Variable(
        "TORCH_FL_SIM_PAGEABLE_GBPS",
        "the cost model's",
        ("simulator",),
        "GB/s from/to any other host memory (`0`: free); " + _SIM_OPTION.format("pageable_gbps"),
    ),
    Variable(
        "TORCH_FL_SIM_COMPUTE_FACTOR",
        "the cost model's",
        ("simulator",),
        "each kernel's device time times this (`>= 1`: a slower chip); " + _SIM_OPTION.format("compute_factor"),
    ),
    Variable(
        "TORCH_FL_SIM_SELF_CACHING",
        "`0`",
        ("simulator",),
        "`1`: report `TFL_CAP_CACHING_ALLOCATOR` and act as a stream-ordered pool (torch-fl then passes "
        "allocations straight through); " + _SIM_OPTION.format("self_caching"),
    ),
    # -- The OpenCL plugin ----------------------------------------------------
    Variable(
        "TORCH_FL_OPENCL_PLATFORM",
        "the first platform with a device",
        ("opencl",),
        "the OpenCL platform to use, by index in the loader's list (`0`, `1`, ...); plugin option `platform`",
    ),
    Variable(
        "TORCH_FL_OPENCL_LIBRARY",
        "`libOpenCL.so.1`",
        ("opencl",),
        "the OpenCL library the plugin opens at run time: another ICD loader, or a driver library itself",
    ),
    # -- Tools and building ---------------------------------------------------
    Variable(
        "TORCHFL_ABI_EXE",
        "the running program, when it is `torchfl-abi`",
        ("torchfl-abi",),
        "the `torchfl-abi` binary `verify` re-runs to check a plugin in a child process (crash isolation, "
        "timeouts; the wheel's `torchfl-abi` script sets it to itself); without one the checks run in-process",
    ),
    Variable(
        "TORCHFL_BUNDLE_SIM",
        "a fresh build",
        ("build",),
        "an already built simulator library (`libtorchfl_sim.so`) to bundle into the package (the Makefile "
        "passes its own)",
    ),
    Variable(
        "TORCHFL_SHIM_WERROR",
        "`1`",
        ("build",),
        "`0`: the C++ shim's warnings do not fail the build (for a compiler newer than CI's)",
    ),
)


def names() -> tuple[str, ...]:
    """Every variable's name, in table order."""
    return tuple(v.name for v in VARIABLES)


def by_name(name: str) -> Variable:
    """The entry for ``name``; KeyError when the table does not list it."""
    for variable in VARIABLES:
        if variable.name == name:
            return variable
    raise KeyError(f"{name} is not in torch-fl's table of environment variables (torch_fl/_env.py)")
