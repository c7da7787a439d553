"""``torch_fl.test_compatibility``: check a plugin against PyTorch's CPU results.

Four checks, one report:

* **numerical conformance** — every ATen operator in the plugin's op table is
  matched to PyTorch's OpInfo database (``torch.testing._internal``); each
  sample input runs on the CPU and on the device and the results are compared
  with ``torch.testing.assert_close``'s tolerances for the dtype. Each sample
  records which operators it dispatched on the device, so a result counts for
  exactly the table operators the sample exercised;
* **autograd conformance** — for differentiable OpInfos, the gradients of a
  random-weighted sum of the outputs with respect to every tensor input,
  on the CPU and on the device (this is what exercises ``*_backward`` kernels);
* **coverage** — the ATen operators a ResNet-18, a Transformer encoder, an
  LSTM, GPT-, Llama- and BERT-style language models and a generation loop
  dispatch (forward and backward), which of them the plugin serves
  natively, and which fell back to the CPU when the models actually ran on the
  device (:func:`torch_fl.fallback_stats`, the ground truth);
* **integrity** — the ABI checks of ``torchfl-abi verify`` on the plugin file.

The report is a :class:`CompatReport`; ``report_dir`` receives ``compat.json``,
a self-contained ``compat.html`` and the terminal summary, ``compat.txt``.
``python -m torch_fl compat`` runs the same from the command line (exit 0:
passed, 1: a check failed, 3: the plugin could not be loaded).

The package has one module per concept: :mod:`~torch_fl.compat.model` (the
report's plain types), :mod:`~torch_fl.compat.report` (the whole report, its
JSON and summary), :mod:`~torch_fl.compat.render` (the HTML page),
:mod:`~torch_fl.compat.names` (op-table spellings),
:mod:`~torch_fl.compat.compare` (device versus CPU results),
:mod:`~torch_fl.compat.opinfo` (the OpInfo database and sample runner),
:mod:`~torch_fl.compat.conformance` (per-operator verdicts),
:mod:`~torch_fl.compat.coverage` (the models; the language models in
:mod:`~torch_fl.compat.lm_coverage`), :mod:`~torch_fl.compat.integrity`
(``torchfl-abi verify``) and :mod:`~torch_fl.compat.runner`
(:func:`test_compatibility`).
"""

from __future__ import annotations

# Helpers that were importable from the single-module ``torch_fl.compat`` stay
# importable from here (``X as X``: an explicit re-export); ``__all__`` is the
# public API.
from .conformance import RANDOM_OPS as RANDOM_OPS
from .coverage import run_coverage as run_coverage
from .integrity import run_integrity as run_integrity
from .model import (
    CheckResult,
    CoverageReport,
    IntegrityReport,
    ModelCoverage,
    OpResult,
    SampleFailure,
)
from .model import PathLike as PathLike
from .names import op_name as op_name
from .opinfo import OPINFO_ALIASES as OPINFO_ALIASES
from .opinfo import find_opinfos as find_opinfos
from .opinfo import load_op_db as load_op_db
from .render import render_html as render_html
from .report import CompatReport
from .runner import test_compatibility

__all__ = [
    "CheckResult",
    "CompatReport",
    "CoverageReport",
    "IntegrityReport",
    "ModelCoverage",
    "OpResult",
    "SampleFailure",
    "test_compatibility",
]
