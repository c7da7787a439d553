"""The integer codes dtypes and reduce ops cross into ``torch_fl._native`` as.

The ABI crate defines each table once (``TFL_DTYPE_TORCH_NAMES``,
``TFL_REDUCE_OP_TORCH_NAMES`` in ``crates/torchfl-ffi``); the extension
exports them as ``_native.DTYPES`` (torch's dtype name -> the packed
``TFL_DType``) and ``_native.REDUCE_OPS`` (``dist.ReduceOp`` name ->
``TFL_ReduceOp``). This module turns the names into ``torch.dtype`` and
``dist.ReduceOp`` values: the only place Python maps them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .. import _native

# torch.dtype -> code, for the dtypes this torch has (uint16 and up are recent).
DTYPE_CODES: dict[torch.dtype, int] = {
    dt: code for name, code in _native.DTYPES.items() if isinstance(dt := getattr(torch, name, None), torch.dtype)
}
# code -> torch's dtype name, for messages.
DTYPE_NAMES: dict[int, str] = {code: name for name, code in _native.DTYPES.items()}
# code -> dist.ReduceOp name ("SUM").
REDUCE_OP_NAMES: dict[int, str] = {code: name for name, code in _native.REDUCE_OPS.items()}
_REDUCE_OPS: list[tuple[Any, int]] = [
    (getattr(dist.ReduceOp, name), code) for name, code in _native.REDUCE_OPS.items() if hasattr(dist.ReduceOp, name)
]


def dtype_code(dtype: torch.dtype) -> int:
    """The code of ``dtype``; raises ``TypeError`` for one the plugin ABI cannot describe."""
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        raise TypeError(
            f"torch-fl native collectives do not support {dtype}: the plugin ABI cannot describe it; convert the "
            "tensor (to float32, say), or set TORCH_FL_DIST_STAGED=1 to run collectives through gloo"
        ) from None


def reduce_op_code(op: Any) -> int:
    """The code of ``op`` (a ``dist.ReduceOp``); raises ``ValueError`` naming the supported ones."""
    for value, code in _REDUCE_OPS:
        if op == value:
            return code
    names = [REDUCE_OP_NAMES[code] for _value, code in _REDUCE_OPS]
    raise ValueError(
        f"torch-fl's c10d backend does not support the reduce op {op}; use {', '.join(names[:-1])} or {names[-1]} "
        "(PREMUL_SUM: scale the tensor, then SUM)"
    )


def reduce_op(name: str) -> int:
    """The code of the ``dist.ReduceOp`` named ``name`` (``"SUM"``)."""
    return _native.REDUCE_OPS[name]
