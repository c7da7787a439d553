"""What the core knows of PyTorch without PyTorch agrees with the installed PyTorch.

``torchfl-abi verify`` has no PyTorch, yet must judge a plugin's op table as
registration does. So the Rust core parses custom-operator schemas itself
(``crates/torchfl-core/src/schema.rs``), in the forms the plugin ABI can call,
and carries the list of ATen operators (``crates/torchfl-core/data``). These
tests hold both to PyTorch: every ATen schema in those forms is accepted, no
schema is accepted that PyTorch's parser refuses (mutations of real schemas,
a fixed seed), and the list is the installed release's.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from torch_fl import _native

SCALARS = (
    torch._C.IntType,
    torch._C.SymIntType,
    torch._C.FloatType,
    torch._C.BoolType,
    torch._C.StringType,
    torch._C.NumberType,
    torch._C.DeviceObjType,
    torch._C._GeneratorType,
)
LIST_ITEMS = (torch._C.IntType, torch._C.SymIntType, torch._C.FloatType, torch._C.BoolType)


def passable(t: torch._C.JitType) -> bool:
    """Whether the plugin ABI can pass an argument of type ``t``."""
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    # ScalarType, Layout and MemoryFormat arguments read as int here.
    if isinstance(t, (torch._C.TensorType, *SCALARS)):
        return True
    if isinstance(t, torch._C.ListType):
        item = t.getElementType()
        if isinstance(item, torch._C.OptionalType):
            return isinstance(item.getElementType(), torch._C.TensorType)
        return isinstance(item, (torch._C.TensorType, *LIST_ITEMS))
    return False


def is_tensor_type(t: torch._C.JitType) -> bool:
    """Tensor, Tensor?, Tensor[] or Tensor?[]."""
    while isinstance(t, (torch._C.OptionalType, torch._C.ListType)):
        t = t.getElementType()
    return isinstance(t, torch._C.TensorType)


def in_abi_forms(s: torch._C.FunctionSchema) -> bool:
    """Plugin-callable: passable arguments, tensor returns, no views, no varargs."""
    if "..." in str(s) or not all(passable(a.type) for a in s.arguments):
        return False
    # Only tensors can be written by a kernel (TorchScript's list ops write lists).
    if any(a.alias_info is not None and not is_tensor_type(a.type) for a in s.arguments):
        return False
    for r in s.returns:
        if not isinstance(r.type, torch._C.TensorType) or (r.alias_info is not None and not r.alias_info.is_write):
            return False
    # In-place by name: the first argument is written and returned (the
    # core checks PyTorch's naming convention).
    name = s.name.split("::")[1]
    if name.endswith("_") and not name.endswith("__"):
        first = s.arguments[0].alias_info if s.arguments else None
        returned = s.returns[0].alias_info if s.returns else None
        if first is None or not first.is_write or returned is None or returned.before_set != first.before_set:
            return False
    return True


def reparsable_aten_schemas() -> list[torch._C.FunctionSchema]:
    """ATen schemas whose printed form PyTorch parses back (some defaults print in forms it does not read)."""
    out = []
    for s in torch._C._jit_get_all_schemas():
        if not s.name.startswith("aten::"):
            continue
        try:
            torch._C.parse_schema(str(s))
        except RuntimeError:
            continue
        out.append(s)
    return out


SCHEMAS = reparsable_aten_schemas()


def op_name(s: torch._C.FunctionSchema) -> str:
    return s.name + (f".{s.overload_name}" if s.overload_name else "")


def test_every_aten_schema_in_the_abi_forms_is_accepted() -> None:
    callable_by_plugins = [s for s in SCHEMAS if in_abi_forms(s)]
    assert len(callable_by_plugins) > 1000, len(callable_by_plugins)
    refused = {str(s): _native.check_custom_schema(op_name(s), str(s)) for s in callable_by_plugins}
    refused = {k: v for k, v in refused.items() if v is not None}
    assert not refused, "\n".join(f"{k}\n  {v}" for k, v in list(refused.items())[:20])


def test_schemas_outside_the_abi_forms_are_refused_with_the_reason() -> None:
    cases = {
        "fx::op(Dimname x) -> Tensor": "the type Dimname, which the plugin ABI cannot pass",
        "fx::op(Tensor x) -> int": "plugin kernels return tensors only",
        "fx::op(Tensor(a) x) -> Tensor(a)": "plugin kernels cannot return views",
        "fx::op_(Tensor x) -> Tensor": "named as an in-place operator",
    }
    for schema, reason in cases.items():
        problem = _native.check_custom_schema(schema.split("(")[0], schema)
        assert problem is not None and reason in problem, (schema, problem)


def mutate(text: str, rng: random.Random) -> str:
    """One random edit of the arguments and returns (the name stays)."""
    start = text.index("(") + 1
    i = rng.randrange(start, len(text))
    kind = rng.randrange(4)
    if kind == 0:
        return text[:i] + text[i + 1 :]
    if kind == 1:
        return text[:i] + text[i] + text[i:]
    if kind == 2 and i + 1 < len(text):
        return text[:i] + text[i + 1] + text[i] + text[i + 2 :]
    return text[:i] + rng.choice("()[]?!*,=-.>:|' x0aT") + text[i:]


@pytest.mark.parametrize("seed", range(8))
def test_no_schema_is_accepted_that_pytorch_refuses(seed: int) -> None:
    rng = random.Random(seed)
    accepted = 0
    for s in rng.sample(SCHEMAS, 1000):
        text = str(s)
        for _ in range(5):
            text = mutate(text, rng)
            if _native.check_custom_schema(op_name(s), text) is not None:
                continue
            accepted += 1
            try:
                torch._C.parse_schema(text)
            except (RuntimeError, IndexError, ValueError) as e:  # IndexError: a number out of range
                pytest.fail(f"the core accepts {text!r}, which PyTorch refuses: {e}")
    assert accepted > 0, "no mutant was accepted: the test checks nothing"


def test_the_aten_operator_list_is_the_installed_pytorchs() -> None:
    generator = (
        Path(__file__).resolve().parent.parent / "crates" / "torchfl-core" / "data" / "generate_aten_operators.py"
    )
    spec = importlib.util.spec_from_file_location("generate_aten_operators", generator)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    listed = module.OUT.read_text()
    if not listed.startswith(f"# PyTorch {torch.__version__.split('+')[0]}\n"):
        pytest.skip(f"the list is of {listed.splitlines()[0][2:]}, PyTorch {torch.__version__} is installed")
    assert listed == module.render(), f"regenerate it: python {generator}"
