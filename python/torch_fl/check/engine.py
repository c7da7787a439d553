"""The analysis: a libcst visitor that finds CUDA-only constructs, and the codemod that fixes them.

One pass over the syntax tree, with import aliases resolved by libcst's
QualifiedNameProvider (``import torch as th``, ``from torch import cuda``,
``from torch.cuda import amp`` all resolve to ``torch.cuda.*``). String
literals are only looked at in device positions (see :func:`_device_literal`
and its callers), so "cuda" in comments, docstrings, log messages and other
strings is never reported. Each hit may carry a fix: a function from the
(updated) node to its replacement, which :func:`fix_source` applies with a
transformer over the same tree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

try:
    import libcst as cst
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
    from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider
except ImportError as err:  # pragma: no cover - exercised by hand without libcst
    raise ImportError(
        "`torch_fl check` needs libcst: install it with `pip install 'torch-fl[check]'` (or `pip install libcst`)"
    ) from err

from .cuda_api import AMP_CALLS, lookup
from .rules import RULES_BY_ID

#: Raised by check_source and fix_source for code that does not parse.
ParserSyntaxError = cst.ParserSyntaxError
_NodeT = TypeVar("_NodeT", bound=cst.CSTNode)
Fix = Callable[[cst.CSTNode], "cst.CSTNode | cst.RemovalSentinel"]

_CUDA_STRING = re.compile(r"cuda(:\d+)?")
_DEVICE_NAME = re.compile(r"(^|_)dev(ice)?(s|_|\d|$)|device")
_DEVICEISH = re.compile(r"dev|\.type\b|accel", re.IGNORECASE)
#: Calls whose first positional argument is a device or device type.
_DEVICE_FIRST = {
    "torch.device",
    "torch.set_default_device",
    "torch.get_device_module",
    "torch.Generator",
}
_AMP_FIRST = {"torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler"}
_DIST_INIT = {"torch.distributed.init_process_group", "torch.distributed.new_group"}
_DEVICE_KWARGS = {"device": "FL001", "pin_memory_device": "FL001", "device_type": "FL003", "map_location": "FL004"}
_DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel"}


@dataclass(frozen=True)
class Finding:
    """One CUDA-only construct.

    Attributes:
        path: The file, as given on the command line (or ``<string>``).
        line: 1-based line of the construct's start.
        column: 1-based column of the construct's start.
        end_line: 1-based line of its end.
        end_column: 1-based column just past its end.
        rule: The rule id (see :data:`torch_fl.check.rules.RULES`).
        message: What was found and why it is CUDA-only.
        replacement: The device-agnostic code (what ``--fix`` writes, when ``fixable``) or advice.
        fixable: Whether ``--fix`` rewrites it.
    """

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    rule: str
    message: str
    replacement: str
    fixable: bool

    def to_dict(self) -> dict[str, object]:
        """The finding as a JSON-ready dict."""
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "rule": self.rule,
            "name": RULES_BY_ID[self.rule].name,
            "message": self.message,
            "replacement": self.replacement,
            "fixable": self.fixable,
        }


@dataclass
class _Hit:
    node: cst.CSTNode
    rule: str
    message: str
    advice: str
    fix: Fix | None


def _string_value(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _device_literal(node: cst.CSTNode) -> bool:
    """Whether ``node`` spells a CUDA device: "cuda", "cuda:1", f"cuda:{rank}", "cuda:" + str(rank)."""
    value = _string_value(node)
    if value is not None:
        return _CUDA_STRING.fullmatch(value) is not None
    if isinstance(node, cst.FormattedString) and node.parts:
        first = node.parts[0]
        if isinstance(first, cst.FormattedStringText):
            return first.value == "cuda:" or (first.value == "cuda" and len(node.parts) == 1)
        return False
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        return _string_value(node.left) == "cuda:"
    return False


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from _walk(child)


def _target_name(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return ""


class _Analyzer(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ParentNodeProvider)

    def __init__(self, torch_name: str) -> None:
        super().__init__()
        self.hits: list[_Hit] = []
        self.claimed: set[int] = set()
        self.t = torch_name
        self.acc = f"{torch_name}.accelerator.current_accelerator().type"
        self._cuda_guard_depth = 0

    # -- helpers -----------------------------------------------------------------------------------

    def _qnames(self, node: cst.CSTNode) -> set[str]:
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

    def _cuda_qname(self, node: cst.CSTNode) -> str | None:
        for name in self._qnames(node):
            if name == "torch.cuda" or name.startswith("torch.cuda."):
                return name
        return None

    def _expr(self, code: str) -> cst.BaseExpression:
        return cst.parse_expression(code.replace("{T}", self.t).replace("{ACC}", self.acc))

    def _hit(self, node: cst.CSTNode, rule: str, message: str, advice: str, fix: Fix | None) -> None:
        if id(node) in self.claimed or self._cuda_guard_depth:
            return
        self.claimed.add(id(node))
        self.hits.append(_Hit(node, rule, message, advice, fix))

    def _claim_tree(self, node: cst.CSTNode) -> None:
        self.claimed.update(id(n) for n in _walk(node))

    def _literal_fix(self, node: cst.CSTNode) -> Fix:
        """Replaces the word "cuda" in a device literal with the current accelerator's type (a str)."""

        def fix(updated: cst.CSTNode) -> cst.CSTNode:
            value = _string_value(updated)
            if value is not None:
                rest = value[len("cuda") :]
                return self._expr("{ACC}" if not rest else 'f"{' + "{ACC}" + "}" + rest + '"')
            if isinstance(updated, cst.FormattedString):
                first = updated.parts[0]
                assert isinstance(first, cst.FormattedStringText)
                head: list[cst.BaseFormattedStringContent] = [cst.FormattedStringExpression(self._expr("{ACC}"))]
                if first.value != "cuda":
                    head.append(cst.FormattedStringText(first.value[len("cuda") :]))
                return updated.with_changes(parts=[*head, *updated.parts[1:]])
            assert isinstance(updated, cst.BinaryOperation)
            return updated.with_changes(left=self._expr('f"{' + "{ACC}" + '}:"'))

        return fix

    def _device_string(self, node: cst.CSTNode, rule: str, where: str) -> None:
        if _device_literal(node):
            message = f"CUDA device string in {where}: it names CUDA, other accelerators never get the work"
            self._hit(node, rule, message, RULES_BY_ID[rule].rewrite, self._literal_fix(node))

    # -- guards ------------------------------------------------------------------------------------

    def _is_cuda_type_guard(self, test: cst.BaseExpression) -> bool:
        """``x.type == "cuda"``: code under it is CUDA-specific on purpose, other devices skip it."""
        return (
            isinstance(test, cst.Comparison)
            and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Equal)
            and isinstance(test.left, cst.Attribute)
            and test.left.attr.value == "type"
            and _string_value(test.comparisons[0].comparator) == "cuda"
        )

    def visit_If(self, node: cst.If) -> bool | None:
        if self._is_cuda_type_guard(node.test):
            self._claim_tree(node.test)
            self._cuda_guard_depth += 1
            node.body.visit(self)
            self._cuda_guard_depth -= 1
            if node.orelse is not None:
                node.orelse.visit(self)
            return False
        return None

    # -- imports are resolved, never reported ------------------------------------------------------

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    # -- names and attributes ----------------------------------------------------------------------

    def _reference(self, node: cst.Attribute | cst.Name) -> None:
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return  # the outermost attribute of the chain reports
        names = self._qnames(node)
        if names & _DATA_PARALLEL:
            self._hit(
                node, "FL050", "nn.DataParallel replicates over CUDA devices only", RULES_BY_ID["FL050"].rewrite, None
            )
            return
        backend = next((n for n in names if n.startswith(("torch.backends.cuda.", "torch.backends.cudnn."))), None)
        if backend is not None:
            self._backend_flag(node, backend, parent)
            return
        qualified = self._cuda_qname(node)
        if qualified is None:
            return
        if qualified.startswith("torch.cuda.amp."):
            self._amp(node, qualified, parent)
            return
        entry = lookup(qualified)
        if entry.rule == "FL020":
            message = "torch.cuda.is_available() is False on every other accelerator"
            if self._in_test(node):
                message += ": this guard falls back to the CPU there"
        else:
            message = f"{qualified} is CUDA-only: {RULES_BY_ID[entry.rule].why}"
        replacement = entry.replacement
        if replacement is None:
            self._hit(node, entry.rule, message, entry.advice, None)
            return
        new = replacement
        if isinstance(parent, cst.Call) and parent.func is node:
            # Reported on the call, so the finding shows the whole rewritten call.
            self.claimed.add(id(node))

            def fix_call(updated: cst.CSTNode) -> cst.CSTNode:
                assert isinstance(updated, cst.Call)
                return updated.with_changes(func=self._expr(new))

            self._hit(parent, entry.rule, message, entry.advice, fix_call)
        else:
            self._hit(node, entry.rule, message, entry.advice, lambda _: self._expr(new))

    def _in_test(self, node: cst.CSTNode) -> bool:
        current: cst.CSTNode | None = node
        while current is not None:
            parent = self.get_metadata(ParentNodeProvider, current, None)
            if isinstance(parent, (cst.If, cst.IfExp, cst.While)) and parent.test is current:
                return True
            current = parent
        return False

    def _backend_flag(self, node: cst.CSTNode, qualified: str, parent: cst.CSTNode | None) -> None:
        rule = "FL041" if qualified.startswith("torch.backends.cudnn.") else "FL040"
        flag = qualified[len("torch.backends.") :]
        message = f"torch.backends.{flag} only affects CUDA kernels"
        fix: Fix | None = None
        grandparent = self.get_metadata(ParentNodeProvider, parent, None) if parent is not None else None
        if (
            flag == "cuda.matmul.allow_tf32"
            and isinstance(parent, cst.AssignTarget)
            and isinstance(grandparent, cst.Assign)
            and len(grandparent.targets) == 1
            and isinstance(grandparent.value, cst.Name)
            and grandparent.value.value in ("True", "False")
        ):
            precision = "high" if grandparent.value.value == "True" else "highest"
            statement = grandparent
            self.claimed.add(id(node))
            self._hit(
                statement,
                rule,
                message,
                f'torch.set_float32_matmul_precision("{precision}")',
                lambda _: cst.Expr(self._expr(f'{{T}}.set_float32_matmul_precision("{precision}")')),
            )
            return
        self._hit(node, rule, message, RULES_BY_ID[rule].rewrite, fix)

    def _amp(self, node: cst.CSTNode, qualified: str, parent: cst.CSTNode | None) -> None:
        name = qualified[len("torch.cuda.amp.") :]
        message = f"torch.cuda.amp.{name} is a deprecated CUDA-only alias of torch.amp"
        if name not in AMP_CALLS:
            self._hit(node, "FL028", message, "torch.amp", None)
            return
        callee, where = AMP_CALLS[name]
        if isinstance(parent, cst.Call) and parent.func is node:
            self.claimed.add(id(node))

            def fix_call(updated: cst.CSTNode) -> cst.CSTNode:
                assert isinstance(updated, cst.Call)
                if where == "positional":
                    args = [cst.Arg(self._expr("{ACC}")), *updated.args]
                else:
                    args = [*updated.args, cst.Arg(self._expr("{ACC}"), keyword=cst.Name("device_type"))]
                return updated.with_changes(func=self._expr(callee), args=_commas(args))

            self._hit(parent, "FL028", message, "", fix_call)
        elif where == "device_type":
            self._hit(node, "FL028", message, "", lambda _: self._expr(callee + "(device_type={ACC})"))
        else:
            self._hit(node, "FL028", message, f"torch.amp.{name}({self.acc}, ...)", None)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "is_cuda":
            self._hit(
                node,
                "FL011",
                "is_cuda is False for tensors on every other accelerator",
                f"{_code(node.value)}.device.type == {self.acc}",
                None,
            )
            return
        self._reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            return
        self._reference(node)

    # -- calls ---------------------------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        names = self._qnames(node.func)
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda" and self._cuda_qname(func) is None:
            self._hit(node, "FL010", ".cuda() moves to CUDA only", RULES_BY_ID["FL010"].rewrite, self._cuda_method_fix)
        positional = [a for a in node.args if a.keyword is None and a.star == ""]
        if positional:
            first = positional[0].value
            if names & _DEVICE_FIRST or (isinstance(func, cst.Attribute) and func.attr.value == "to"):
                self._device_string(first, "FL001", f"{_code(func)}(...)")
            elif names & _AMP_FIRST:
                self._device_string(first, "FL003", f"{_code(func)}(...)")
            elif names & _DIST_INIT and _string_value(first) == "nccl":
                self._nccl(first)
            elif "torch.load" in names and len(positional) > 1:
                self._device_string(positional[1].value, "FL004", "torch.load's map_location")
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "startswith"
                and _DEVICEISH.search(_code(func.value))
                and _string_value(first) == "cuda"
            ):
                self._hit(first, "FL002", "device-type test on the string 'cuda'", self.acc, self._literal_fix(first))
            first_value = _string_value(first) or ""
        else:
            first_value = ""
        for arg in node.args:
            if arg.keyword is None:
                continue
            keyword = arg.keyword.value
            if keyword in _DEVICE_KWARGS:
                self._device_string(arg.value, _DEVICE_KWARGS[keyword], f"{keyword}=")
            elif keyword == "backend" and _string_value(arg.value) == "nccl":
                self._nccl(arg.value)
            elif keyword == "default" and "device" in first_value:
                self._device_string(arg.value, "FL001", f"the default of {first_value}")
            elif keyword in ("pin_memory", "fused", "foreach") and self._keyed_on_cuda(arg.value):
                self._keyed_kwarg(arg, keyword)

    def _cuda_method_fix(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
        args = list(updated.args)
        if args and args[0].keyword is None and args[0].star == "":
            index = _code(args[0].value)
            device = self._expr(f"{{T}}.device({{ACC}}, {index})")
            args = [args[0].with_changes(value=device), *args[1:]]
        elif args and args[0].keyword is not None and args[0].keyword.value == "device":
            device = self._expr(f"{{T}}.device({{ACC}}, {_code(args[0].value)})")
            args = [cst.Arg(device), *args[1:]]
        else:
            args = [cst.Arg(self._expr("{ACC}")), *args]
        return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")), args=_commas(args))

    def _nccl(self, node: cst.CSTNode) -> None:
        self._hit(
            node,
            "FL005",
            'backend "nccl" exists only for CUDA',
            RULES_BY_ID["FL005"].rewrite,
            lambda _: self._expr("{T}.distributed.get_default_backend_for_device({ACC})"),
        )

    def _keyed_on_cuda(self, value: cst.CSTNode) -> bool:
        for sub in _walk(value):
            if _device_literal(sub) or (isinstance(sub, cst.Attribute) and sub.attr.value == "is_cuda"):
                return True
            if isinstance(sub, (cst.Attribute, cst.Name)) and self._cuda_qname(sub) is not None:
                return True
        return False

    def _keyed_kwarg(self, arg: cst.Arg, keyword: str) -> None:
        self._claim_tree(arg.value)
        fix: Fix | None
        if keyword == "pin_memory":
            rule, fix = "FL006", self._pin_memory_fix
            advice = f"pin_memory={self.t}.accelerator.is_available()"
        elif keyword == "foreach":
            rule, fix, advice = "FL007", _remove, "omit foreach= (PyTorch picks foreach where supported)"
        else:
            rule, fix = "FL007", None
            advice = RULES_BY_ID["FL007"].rewrite
        self._hit(arg, rule, f"{keyword}= is decided by CUDA: other accelerators lose it", advice, fix)

    def _pin_memory_fix(self, updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Arg)
        return updated.with_changes(value=self._expr("{T}.accelerator.is_available()"))

    # -- device strings outside calls ----------------------------------------------------------------

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._named_value(_target_name(target.target), node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._named_value(_target_name(node.target), node.value)

    def visit_Param(self, node: cst.Param) -> None:
        if node.default is not None:
            self._named_value(node.name.value, node.default)

    def _named_value(self, name: str, value: cst.CSTNode) -> None:
        lowered = name.lower()
        if _DEVICE_NAME.search(lowered):
            self._device_string(value, "FL001", f"`{name}`")
        elif "backend" in lowered and _string_value(value) == "nccl":
            self._nccl(value)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        literal = next((n for n in (node.body, node.orelse) if _device_literal(n)), None)
        if literal is None:
            return
        test = node.test
        message = "device-type inference on the string 'cuda': every other accelerator becomes the CPU"
        in_test = (
            isinstance(test, cst.Comparison)
            and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.In)
            and _string_value(test.left) == "cuda"
            and _string_value(node.body) == "cuda"
        )
        available = isinstance(test, cst.Call) and self._cuda_qname(test.func) == "torch.cuda.is_available"
        if in_test and isinstance(test, cst.Comparison):
            source = _code(test.comparisons[0].comparator)
            self._hit(node, "FL002", message, "", lambda _: self._expr(f"{{T}}.device({source}).type"))
            self._claim_tree(node)
        elif available:
            literal_fix = self._literal_fix(literal)

            def fix_ifexp(updated: cst.CSTNode) -> cst.CSTNode:
                assert isinstance(updated, cst.IfExp)
                body = literal_fix(updated.body) if _device_literal(updated.body) else updated.body
                orelse = literal_fix(updated.orelse) if _device_literal(updated.orelse) else updated.orelse
                return updated.with_changes(test=self._expr("{T}.accelerator.is_available()"), body=body, orelse=orelse)

            self._hit(node, "FL002", message, "", fix_ifexp)
            self._claim_tree(node)
        else:
            self._hit(literal, "FL002", message, self.acc, self._literal_fix(literal))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        # An exact "cuda"/"cuda:N" compared with anything is a device test in practice.
        for operand in (node.left, *(c.comparator for c in node.comparisons)):
            if _device_literal(operand):
                message = "device-type test on the string 'cuda': false for every other accelerator"
                self._hit(operand, "FL002", message, self.acc, self._literal_fix(operand))


def _remove(updated: cst.CSTNode) -> cst.RemovalSentinel:
    return cst.RemovalSentinel.REMOVE


def _commas(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    """Arguments with a comma after each but the last (args moved around keep their own commas)."""
    out = []
    for i, arg in enumerate(args):
        last = i == len(args) - 1
        comma = cst.MaybeSentinel.DEFAULT if last else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        out.append(arg.with_changes(comma=comma))
    return out


_EMPTY = cst.Module(body=[])


def _code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _torch_binding(module: cst.Module) -> str | None:
    """The name a module binds ``torch`` to at top level (``import torch``, ``import torch as th``)."""
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    if _code(alias.name) == "torch":
                        if alias.asname is None:
                            return "torch"
                        asname = alias.asname.name
                        if isinstance(asname, cst.Name):
                            return asname.value
    return None


class _Fixer(cst.CSTTransformer):
    def __init__(self, fixes: dict[int, Fix]) -> None:
        super().__init__()
        self.fixes = fixes

    def on_leave(
        self, original_node: _NodeT, updated_node: _NodeT
    ) -> _NodeT | cst.RemovalSentinel | cst.FlattenSentinel[_NodeT]:
        fix = self.fixes.get(id(original_node))
        if (
            isinstance(original_node, cst.Call)
            and isinstance(updated_node, cst.Call)
            and updated_node.args
            and len(updated_node.args) < len(original_node.args)
        ):
            # An argument was removed: the new last one must not keep its comma.
            last = updated_node.args[-1].with_changes(comma=original_node.args[-1].comma)
            updated_node = cast(_NodeT, updated_node.with_changes(args=[*updated_node.args[:-1], last]))
        if fix is None:
            return updated_node
        # A fix returns a node of whatever kind the rewrite needs (an Assign becomes an Expr).
        return cast(_NodeT, fix(updated_node))


@dataclass
class _Analysis:
    wrapper: MetadataWrapper
    hits: list[_Hit]
    torch_bound: bool


def _analyze(source: str) -> _Analysis:
    module = cst.parse_module(source)
    binding = _torch_binding(module)
    wrapper = MetadataWrapper(module)
    analyzer = _Analyzer(binding or "torch")
    wrapper.visit(analyzer)
    return _Analysis(wrapper, analyzer.hits, binding is not None)


def _findings(path: str, analysis: _Analysis) -> list[Finding]:
    positions = analysis.wrapper.resolve(PositionProvider)
    out = []
    for hit in analysis.hits:
        where = positions[hit.node]
        if hit.fix is not None:
            replaced = hit.fix(hit.node)
            replacement = "(remove it)" if isinstance(replaced, cst.RemovalSentinel) else _code(replaced)
        else:
            replacement = hit.advice
        out.append(
            Finding(
                path,
                where.start.line,
                where.start.column + 1,
                where.end.line,
                where.end.column + 1,
                hit.rule,
                hit.message,
                replacement,
                hit.fix is not None,
            )
        )
    out.sort(key=lambda f: (f.line, f.column, f.rule))
    return out


def check_source(source: str, path: str = "<string>") -> list[Finding]:
    """Every CUDA-only construct in ``source``.

    Raises:
        libcst.ParserSyntaxError: ``source`` does not parse.
    """
    return _findings(path, _analyze(source))


def fix_source(source: str, path: str = "<string>") -> tuple[str, list[Finding]]:
    """Apply the mechanical rewrites; return the new source and the findings the fixes addressed.

    ``import torch`` is added when a rewrite needs it and the module does not bind ``torch``.
    """
    analysis = _analyze(source)
    fixable = [hit for hit in analysis.hits if hit.fix is not None]
    findings = [f for f in _findings(path, analysis) if f.fixable]
    if not fixable:
        return source, findings
    fixes: dict[int, Fix] = {}
    for hit in fixable:
        assert hit.fix is not None
        fixes[id(hit.node)] = hit.fix
    fixed = analysis.wrapper.module.visit(_Fixer(fixes))
    context = CodemodContext()
    if not analysis.torch_bound:
        AddImportsVisitor.add_needed_import(context, "torch")
        fixed = AddImportsVisitor(context).transform_module(fixed)
    # Imports of torch.cuda names the rewrites left unused go too.
    for module_name, name in _cuda_imports(fixed):
        RemoveImportsVisitor.remove_unused_import(context, module_name, name)
    fixed = RemoveImportsVisitor(context).transform_module(fixed)
    return fixed.code, findings


def _cuda_imports(module: cst.Module) -> list[tuple[str, str]]:
    """``(module, name)`` of each top-level ``from torch.cuda[...] import name`` / ``from torch import cuda``."""
    out = []
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if not isinstance(small, cst.ImportFrom) or small.module is None or small.relative:
                continue
            if isinstance(small.names, cst.ImportStar):
                continue
            source = _code(small.module)
            for alias in small.names:
                name = _code(alias.name)
                if source.startswith("torch.cuda") or (source == "torch" and name == "cuda"):
                    out.append((source, name))
    return out
