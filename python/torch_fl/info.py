"""``python -m torch_fl info``: the environment report to attach to a bug report.

Like ``python -m torch.utils.collect_env``, for what torch-fl adds: its own
and its ABI version, the torch it was built for and the one installed,
every plugin it can find (source, ABI version, status; none is
initialized), the registered device and its properties, the fallback mode
and the environment variables torch-fl reads.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import Any

import torch

from . import _env, _native, _shim, fallback, plugins, selection

__all__ = ["environment_report", "render"]

#: Every environment variable torch-fl reads, from the registry in ``_env``
#: (which the README's table is generated from too).
VARIABLES = _env.names()


def _devices() -> list[dict[str, Any]]:
    name = _native.bound_device_name()
    if name is None:
        return []
    module = getattr(torch, name)
    out = []
    for index in range(module.device_count()):
        props = module.get_device_properties(index)
        out.append(
            {
                "device": f"{name}:{index}",
                "name": props.name,
                "total_memory": props.total_memory,
                "capability": list(module.get_device_capability(index)),
            }
        )
    return out


def _autoload() -> dict[str, Any]:
    """What ``import torch`` would bring up here, every plugin package probed."""
    if os.environ.get("TORCH_FL_AUTOLOAD", "1").strip() == "0":
        return {"device": None, "why": "off (TORCH_FL_AUTOLOAD=0)", "candidates": []}
    try:
        choice = selection.autoload_choice(probe_all=True)
    except Exception as e:  # the report must print whatever is broken
        return {"device": None, "why": f"could not decide: {type(e).__name__}: {e}", "candidates": []}
    return {
        "device": choice.device,
        "why": choice.why,
        "candidates": [
            {
                "name": c.name,
                "package": c.package,
                "priority": c.priority,
                "devices": c.devices,
                "chosen": c.chosen,
                "reason": c.reason,
            }
            for c in choice.candidates
        ],
    }


def environment_report() -> dict[str, Any]:
    """Everything ``python -m torch_fl info`` prints, as a JSON-able dict."""
    return {
        "torch_fl": _native.__version__,
        "abi_version": _native.ABI_VERSION,
        "torch_built": _native.BUILT_TORCH_VERSION,
        "torch_installed": torch.__version__,
        "torch_supported": _shim.SPECIFIER,
        "shim": str(_shim.loaded),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "plugins": [
            {
                "name": p.name,
                "source": p.source,
                "path": p.path,
                "abi_version": p.abi_version,
                "status": p.status,
                "detail": p.detail,
            }
            for p in plugins.list_plugins()
        ],
        "autoload": _autoload(),
        "device": _native.bound_device_name(),
        "devices": _devices(),
        "fallback_mode": fallback.fallback_mode(),
        "environment": {k: os.environ[k] for k in VARIABLES if k in os.environ},
    }


def render(report: dict[str, Any]) -> str:
    """The report as text."""
    lines = [
        f"torch-fl:         {report['torch_fl']} (plugin ABI {report['abi_version']})",
        f"torch:            {report['torch_installed']} (torch-fl built against {report['torch_built']}, "
        f"supports {report['torch_supported']})",
        f"C++ shim:         {report['shim']}",
        f"python:           {report['python']}",
        f"platform:         {report['platform']}",
        f"fallback mode:    {report['fallback_mode']}",
        f"device:           {report['device'] or '(none registered in this process)'}",
    ]
    for d in report["devices"]:
        gib = d["total_memory"] / 2**30
        lines.append(f"  {d['device']}: {d['name']}, {gib:.1f} GiB, capability {tuple(d['capability'])}")
    auto = report["autoload"]
    lines.append(f"autoload:         {auto['device'] or '(none)'} ({auto['why']})")
    for c in auto["candidates"]:
        mark = "chosen" if c["chosen"] else "passed over"
        lines.append(f"  {c['name']:<12} {mark:<11} priority {c['priority']:<4} {c['reason']}")
    lines.append("plugins:")
    if not report["plugins"]:
        lines.append("  (none found)")
    for p in report["plugins"]:
        abi = p["abi_version"] or "-"
        lines.append(f"  {p['name']:<12} {p['status']:<11} ABI {abi:<6} {p['source']}")
        lines.append(f"  {'':<12} {p['path']}")
        lines.append(f"  {'':<12} {p['detail']}")
    env = report["environment"]
    lines.append(f"environment ({len(env) or 'none'} of the {len(_env.VARIABLES)} variables torch-fl reads set):")
    width = max(len(v.name) for v in _env.VARIABLES)
    for v in _env.VARIABLES:
        if v.name in env:
            lines.append(f"  {v.name}={env[v.name]}")
        else:
            default = "" if v.default == "unset" else f"; default: {v.default.replace('`', '')}"
            lines.append(f"  {v.name:<{width}}  (unset{default})")
    return "\n".join(lines)


def main(as_json: bool) -> int:
    """Print the report; exit code 0."""
    report = environment_report()
    print(json.dumps(report, indent=2) if as_json else render(report))
    return 0
