"""The checker's rules: one entry per CUDA-only construct it reports.

The table here is the single source of truth: the SARIF output's rule list,
``--list-rules`` and docs/check-rules.md (checked by tests/test_check.py)
all come from :data:`RULES`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One checker rule.

    Attributes:
        id: Stable identifier, e.g. ``FL001``.
        name: Short kebab-case name.
        what: The construct the rule reports.
        why: Why it only works on CUDA.
        rewrite: The device-agnostic replacement.
        fixable: Whether ``--fix`` rewrites it mechanically.
    """

    id: str
    name: str
    what: str
    why: str
    rewrite: str
    fixable: bool


_ACC = "torch.accelerator.current_accelerator().type"

RULES: tuple[Rule, ...] = (
    Rule(
        "FL000",
        "syntax-error",
        "A file that does not parse",
        "The checker cannot see into it; the rest of the run goes on",
        "Fix the syntax error (the checker targets Python 3 syntax libcst parses)",
        False,
    ),
    Rule(
        "FL001",
        "cuda-device-string",
        '`"cuda"`, `"cuda:N"`, `f"cuda:{i}"` in a device position: `device=`, `torch.device(...)`, `.to(...)`, '
        "`torch.set_default_device(...)`, `pin_memory_device=`, a variable, attribute or parameter named `*device*`, "
        "an argparse `--device` default",
        "The string names CUDA; on any other accelerator the tensor lands on a device that does not exist",
        f'`{_ACC}` (`f"{{{_ACC}}}:N"` for an index)',
        True,
    ),
    Rule(
        "FL002",
        "cuda-device-test",
        "Device-type inference and tests on the string \"cuda\": `'cuda' if 'cuda' in device else 'cpu'`, "
        '`"cuda" if torch.cuda.is_available() else "cpu"`, `device.type == "cuda"`, `"cuda" in str(device)`, '
        '`str(device).startswith("cuda")`',
        "Every non-CUDA accelerator is classified as the CPU (or as not an accelerator)",
        f'`torch.device(device).type`; `{_ACC} if torch.accelerator.is_available() else "cpu"`; compare with `{_ACC}`',
        True,
    ),
    Rule(
        "FL003",
        "amp-device-type",
        '`device_type="cuda"` and `torch.autocast("cuda")` / `torch.amp.GradScaler("cuda")`',
        "Autocast and the gradient scaler are per device type; `cuda` leaves other accelerators in fp32 or fails",
        f"`device_type=device.type` (or `{_ACC}`)",
        True,
    ),
    Rule(
        "FL004",
        "cuda-map-location",
        '`torch.load(..., map_location="cuda")`',
        "Loading onto CUDA fails on machines without it",
        f"`map_location={_ACC}` (or the model's device)",
        True,
    ),
    Rule(
        "FL005",
        "nccl-backend",
        '`backend="nccl"` (init_process_group, new_group, a `*backend*` variable)',
        "NCCL exists only for CUDA",
        "`init_process_group(device_id=torch.device(acc, local_rank))` and let PyTorch pick the backend, or "
        f"`torch.distributed.get_default_backend_for_device({_ACC})`",
        True,
    ),
    Rule(
        "FL006",
        "pin-memory-keyed-on-cuda",
        '`pin_memory=` decided by CUDA: `pin_memory=torch.cuda.is_available()`, `pin_memory=("cuda" in device)`',
        "Pinned memory speeds host-to-device copies on every accelerator, not only CUDA",
        "`pin_memory=torch.accelerator.is_available()`",
        True,
    ),
    Rule(
        "FL007",
        "fused-foreach-keyed-on-cuda",
        "Optimizer `fused=` / `foreach=` decided by CUDA",
        "Other accelerators lose the fast path, or (`fused=True`) fail when the device has no fused kernel",
        "`foreach=`: omit it (PyTorch picks foreach on devices that support it); `fused=`: omit it, or enable "
        "it only for device types you know have fused optimizer kernels",
        True,
    ),
    Rule(
        "FL010",
        "tensor-cuda-method",
        "`.cuda()` on a tensor or module",
        "Moves to CUDA only",
        f"`.to({_ACC})` (`.to(torch.device(acc, N))` for `.cuda(N)`)",
        True,
    ),
    Rule(
        "FL011",
        "is-cuda",
        "`tensor.is_cuda`",
        "False for tensors on every other accelerator",
        f'`tensor.device.type == {_ACC}` (or `tensor.device.type != "cpu"`, depending on the intent)',
        False,
    ),
    Rule(
        "FL020",
        "cuda-is-available",
        "`torch.cuda.is_available()`, notably guards whose else-branch falls back to the CPU",
        "False on every other accelerator: the program silently runs on the CPU",
        "`torch.accelerator.is_available()`",
        True,
    ),
    Rule(
        "FL021",
        "cuda-device-management",
        "`torch.cuda.device_count`, `current_device`, `set_device`, `device(...)`, `get_device_name`, "
        "`get_device_properties`, ...",
        "The CUDA device module only knows CUDA devices",
        "`torch.accelerator.device_count`, `current_device_index`, `set_device_index`, `device_index`; "
        "`torch.get_device_module(device).<name>` for the rest",
        True,
    ),
    Rule(
        "FL022",
        "cuda-synchronize",
        "`torch.cuda.synchronize()`",
        "Synchronizes CUDA only (and fails without it): timings and host reads on other devices race",
        "`torch.accelerator.synchronize()`",
        True,
    ),
    Rule(
        "FL023",
        "cuda-memory",
        "`torch.cuda.memory_allocated`, `max_memory_allocated`, `memory_reserved`, `reset_peak_memory_stats`, "
        "`empty_cache`, `mem_get_info`, `memory_stats`, ...",
        "CUDA's caching allocator only",
        "`torch.accelerator.<same name>` (`get_memory_info` for `mem_get_info`)",
        True,
    ),
    Rule(
        "FL024",
        "cuda-streams",
        "`torch.cuda.Stream`, `current_stream`, `set_stream`, `stream(...)`, `default_stream`",
        "CUDA streams only",
        "`torch.Stream`, `torch.accelerator.current_stream`, `torch.accelerator.set_stream`, `with stream:`",
        True,
    ),
    Rule(
        "FL025",
        "cuda-events",
        "`torch.cuda.Event` (timing, synchronization)",
        "CUDA events only",
        "`torch.Event` (same arguments: `enable_timing=True`, `record`, `elapsed_time`, `synchronize`)",
        True,
    ),
    Rule(
        "FL026",
        "cuda-rng",
        "`torch.cuda.manual_seed`, `manual_seed_all`, `seed`, `initial_seed`, `get_rng_state`, `set_rng_state`",
        "Seeds or reads the CUDA generators only: runs on other devices are not reproducible",
        "`torch.manual_seed` / `torch.seed` (every device), `torch.accelerator.random.<name>`",
        True,
    ),
    Rule(
        "FL027",
        "cuda-capability",
        "Capability and dtype-support queries: `torch.cuda.get_device_capability`, `is_bf16_supported`, "
        "`is_tf32_supported`, `get_arch_list`",
        "Compute capabilities are NVIDIA's versioning; other devices answer differently or not at all",
        "`torch.accelerator.get_device_capability()` (a dict of supported features), "
        "`torch.get_device_module(device).is_bf16_supported()` where the device module has it",
        False,
    ),
    Rule(
        "FL028",
        "cuda-amp",
        "`torch.cuda.amp.autocast`, `GradScaler`, `custom_fwd`, `custom_bwd`",
        "Deprecated CUDA-only aliases of torch.amp",
        f"`torch.amp.autocast({_ACC}, ...)`, `torch.amp.GradScaler({_ACC})`, "
        f"`torch.amp.custom_fwd(device_type={_ACC})`",
        True,
    ),
    Rule(
        "FL029",
        "cuda-graphs",
        "`torch.cuda.CUDAGraph`, `torch.cuda.graph`, `make_graphed_callables`",
        "CUDA graph capture",
        "`torch.accelerator.Graph` where the device supports graphs (different API); otherwise run eagerly",
        False,
    ),
    Rule(
        "FL030",
        "cuda-tensor-types",
        "`torch.cuda.FloatTensor` and the other CUDA tensor types",
        "Legacy CUDA-typed constructors",
        "`torch.tensor(..., dtype=torch.float32, device=device)` / `x.to(device, torch.float32)`",
        False,
    ),
    Rule(
        "FL031",
        "cuda-api",
        "Any other `torch.cuda` name (`nvtx`, `OutOfMemoryError`, the module itself, ...)",
        "The CUDA device module",
        "`torch.get_device_module(device).<name>`; `torch.OutOfMemoryError`; "
        "`torch.profiler.record_function` for nvtx ranges",
        True,
    ),
    Rule(
        "FL040",
        "cuda-backend-flags",
        "`torch.backends.cuda.*` flags (`matmul.allow_tf32`, SDPA kernel switches, ...)",
        "Only affect CUDA kernels",
        '`torch.set_float32_matmul_precision("high")` for TF32 matmuls; nothing device-agnostic for the rest',
        True,
    ),
    Rule(
        "FL041",
        "cudnn-flags",
        "`torch.backends.cudnn.benchmark`, `deterministic`, `allow_tf32`, `enabled`",
        "cuDNN only: on other accelerators determinism and autotuning are not what the flag promises",
        '`torch.use_deterministic_algorithms(True)` for determinism; `torch.set_float32_matmul_precision("high")` '
        'for TF32; guard the rest with `if device.type == "cuda":`',
        False,
    ),
    Rule(
        "FL050",
        "data-parallel",
        "`torch.nn.DataParallel`",
        "Single-process multi-GPU replication, CUDA only (and deprecated in favour of DDP)",
        "`torch.nn.parallel.DistributedDataParallel` with one process per device",
        False,
    ),
)

RULES_BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}
