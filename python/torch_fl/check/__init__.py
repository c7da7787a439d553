r"""Static checker for CUDA-only PyTorch code: ``python -m torch_fl check PATH...``.

It parses Python with libcst (an optional dependency: ``pip install
'torch-fl[check]'``), reports each construct that only works on CUDA with
its rule (:data:`RULES`, documented in docs/check-rules.md) and the
device-agnostic rewrite, and with ``--fix`` applies the mechanical ones::

    from torch_fl.check import check_source

    for finding in check_source("import torch\nx = torch.ones(2).cuda()\n"):
        print(finding.rule, finding.replacement)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cli import main
from .rules import RULES, RULES_BY_ID, Rule

if TYPE_CHECKING:
    from .engine import Finding


def check_source(source: str, path: str = "<string>") -> list[Finding]:
    """Every CUDA-only construct in ``source`` (see :func:`torch_fl.check.engine.check_source`).

    Raises:
        ImportError: libcst is not installed (the message says how to install it).
        libcst.ParserSyntaxError: ``source`` does not parse.
    """
    from . import engine

    return engine.check_source(source, path)


def fix_source(source: str, path: str = "<string>") -> tuple[str, list[Finding]]:
    """``source`` with the mechanical rewrites applied, and the findings they address."""
    from . import engine

    return engine.fix_source(source, path)


__all__ = ["RULES", "RULES_BY_ID", "Finding", "Rule", "check_source", "fix_source", "main"]
