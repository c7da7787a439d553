"""Writes aten_operators.txt: the ATen operators of the installed PyTorch.

``torchfl-abi verify`` has no PyTorch, yet must say which op-table names are
not ATen operators (registration warns about them). It checks them against
this list, embedded in the core crate; registration asks the installed
PyTorch. Regenerate it when torch-fl moves to another PyTorch release
(tests/test_schema_check.py compares it with the installed release when the
two match):

    python crates/torchfl-core/data/generate_aten_operators.py
"""

from __future__ import annotations

from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "aten_operators.txt"


def aten_operators() -> list[str]:
    """Every operator the dispatcher knows in the aten namespace, as an op-table name (``add.Tensor``)."""
    names = {name.removeprefix("aten::") for name in torch._C._dispatch_get_all_op_names() if name.startswith("aten::")}
    return sorted(names)


def render() -> str:
    """The file's text for the installed PyTorch."""
    version = torch.__version__.split("+")[0]
    return f"# PyTorch {version}\n" + "".join(f"{name}\n" for name in aten_operators())


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
