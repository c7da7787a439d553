"""Operator names: how the op table spells ATen operators, and which entry serves a dispatched operator."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["op_name"]


def op_name(func: Any) -> str:
    """The op-table spelling of an ``OpOverload``: ``add.Tensor``, ``relu``, ``sim::fused_bias_gelu``."""
    schema_name: str = func._schema.name
    ns, _, base = schema_name.partition("::")
    overload = func._overloadname
    name = base if ns == "aten" else schema_name
    return name if overload in ("default", "") else f"{name}.{overload}"


def _base(name: str) -> str:
    return name.split(".", 1)[0]


def _overload(name: str) -> str:
    return name.split(".", 1)[1] if "." in name else ""


def _exercises(table_op: str, dispatched: Iterable[str]) -> bool:
    """Whether a sample that dispatched ``dispatched`` ran the kernel of ``table_op``.

    An ``out`` entry (``abs.out``) serves its functional and in-place forms too.
    """
    names = set(dispatched)
    if table_op in names:
        return True
    if _overload(table_op).endswith("out"):
        base = _base(table_op)
        return any(_base(n) in (base, base + "_") for n in names)
    return False


def _served_natively(op: str, table: Sequence[str]) -> bool:
    """Whether a plugin kernel serves ``op``: listed, or the same operator in another form.

    ``sigmoid_`` is served by a ``sigmoid`` entry (structured operators share
    one kernel registered as ``out``), ``abs`` by ``abs.out``, ``index.Tensor``
    by ``index.Tensor_out``.
    """
    if op in table:
        return True

    def key(name: str) -> tuple[str, str]:
        overload = _overload(name).removesuffix("_out")
        return _base(name).rstrip("_"), "" if overload in ("", "out") else overload

    return key(op) in {key(t) for t in table}
