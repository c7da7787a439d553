"""``python -m torch_fl check``: the static checker for CUDA-only code (pure Python, no device).

The corpus in tests/check_corpus marks each expected finding with
``# expect: RULE``; precision and recall are both exact there.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from torch_fl.check import RULES, check_source, fix_source, main
from torch_fl.check.rules import RULES_BY_ID

from .conftest import ROOT, run_python

CORPUS = ROOT / "tests" / "check_corpus"
CORPUS_FILES = sorted(CORPUS.glob("*.py"))


def expected(source: str) -> set[tuple[int, str]]:
    found = set()
    for number, line in enumerate(source.splitlines(), 1):
        match = re.search(r"# expect: (.*)$", line)
        if match:
            found |= {(number, rule) for rule in match.group(1).split()}
    return found


def found(source: str) -> set[tuple[int, str]]:
    return {(f.line, f.rule) for f in check_source(source)}


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_corpus_precision_and_recall(path: Path) -> None:
    source = path.read_text()
    got, want = found(source), expected(source)
    assert not want - got, f"missed (recall): {sorted(want - got)}"
    assert not got - want, f"false positives (precision): {sorted(got - want)}"


def test_corpus_exercises_every_rule() -> None:
    covered = set().union(*(expected(p.read_text()) for p in CORPUS_FILES))
    assert {rule.id for rule in RULES} - {"FL000"} == {rule for _, rule in covered}


def test_device_agnostic_script_is_clean() -> None:
    source = (CORPUS / "agnostic_train.py").read_text()
    assert "cuda" in source
    assert check_source(source) == []


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_fix_round_trip(path: Path) -> None:
    source = path.read_text()
    before = check_source(source)
    fixed, addressed = fix_source(source)
    ast.parse(fixed)
    after = check_source(fixed)
    assert all(not f.fixable for f in after), [f for f in after if f.fixable]
    assert sorted(f.rule for f in after) == sorted(f.rule for f in before if not f.fixable)
    assert len(addressed) == sum(f.fixable for f in before)
    assert fix_source(fixed)[0] == fixed, "fixing is idempotent"


@pytest.mark.parametrize(
    ("code", "rule"),
    [
        ("import torch as th\nth.cuda.synchronize()\n", "FL022"),
        ("from torch import cuda\ncuda.synchronize()\n", "FL022"),
        ("from torch.cuda import amp\ns = amp.GradScaler()\n", "FL028"),
        ("from torch.cuda import synchronize as sync\nsync()\n", "FL022"),
        ("import torch.cuda\ntorch.cuda.empty_cache()\n", "FL023"),
        ("import torch\nok = torch.cuda.is_bf16_supported()\n", "FL027"),
        ("import torch\ntorch.cuda.nvtx.range_push('step')\n", "FL031"),
        ("import torch\nx = torch.ones(2, device='cuda:1')\n", "FL001"),
        ("import torch\nx = torch.ones(2).to(device='cuda')\n", "FL001"),
        ("import torch\ntorch.distributed.init_process_group(backend='nccl')\n", "FL005"),
        ("import torch\nif torch.cuda.is_available():\n    pass\n", "FL020"),
        ("import torch\nx = torch.load('m.pt', 'cuda')\n", "FL004"),
    ],
)
def test_constructs_and_aliases(code: str, rule: str) -> None:
    assert [f.rule for f in check_source(code)] == [rule]


@pytest.mark.parametrize(
    "code",
    [
        '"""Moves the model to cuda."""\n',
        "# model.cuda() is called by the caller\n",
        "import logging\nlogging.info('running on cuda')\n",
        "print(f'cuda:{0} is busy')\n",
        "names = {'cuda': 1}\nkind = names['cuda']\n",
        "from numba import cuda\n@cuda.jit\ndef k(x):\n    pass\n",
        "import cupy\ncupy.cuda.Device(0).use()\n",
        "import torch\ndev = torch.accelerator.current_accelerator()\nx = torch.ones(2, device=dev)\n",
        "import torch\nwith torch.autocast(device_type=dev.type):\n    pass\n",
        "label = 'cuda' + '-run'\n",
        "import torch\nif x.device.type == 'cuda':\n    torch.cuda.synchronize()\n",
    ],
)
def test_no_false_positives(code: str) -> None:
    assert check_source(code) == []


def test_fix_without_torch_binding_adds_the_import_and_drops_unused_cuda_imports() -> None:
    fixed, addressed = fix_source("from torch.cuda import synchronize\n\nsynchronize()\n")
    assert [f.rule for f in addressed] == ["FL022"]
    assert "import torch\n" in fixed
    assert "torch.accelerator.synchronize()" in fixed
    assert "torch.cuda" not in fixed


def test_fix_uses_the_modules_torch_alias() -> None:
    fixed, _ = fix_source("import torch as th\nx = th.ones(1).cuda(0)\nd = f'cuda:{r}'\ndevice = d\n")
    assert "x = th.ones(1).to(th.device(th.accelerator.current_accelerator().type, 0))" in fixed
    assert "import torch\n" not in fixed


def test_finding_positions_are_one_based() -> None:
    (finding,) = check_source("import torch\n\nx = 1; torch.cuda.synchronize()\n")
    assert (finding.line, finding.column, finding.end_line) == (3, 8, 3)
    assert finding.replacement == "torch.accelerator.synchronize()"


# -- command line ------------------------------------------------------------------------------------


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\nx = torch.ones(2)\n")
    dirty = tmp_path / "dirty.py"
    dirty.write_text("import torch\nx = torch.ones(2).cuda()\n")
    assert main([str(clean)]) == 0
    assert main([str(dirty)]) == 1
    assert main([str(tmp_path / "missing.py")]) == 2
    assert main([]) == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["--format", "yaml", str(clean)])
    assert exit_info.value.code == 2
    out = capsys.readouterr().out
    assert f"{dirty}:2:5: FL010" in out


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--format", "json", str(CORPUS / "ddp_train.py")]) == 1
    records = json.loads(capsys.readouterr().out)
    assert records, "findings"
    for record in records:
        assert {"path", "line", "column", "rule", "message", "replacement"} <= record.keys()
        assert record["rule"] in RULES_BY_ID
    assert {r["rule"] for r in records} >= {"FL005", "FL021", "FL001"}


def test_cli_sarif_structure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--format", "sarif", str(CORPUS / "bench_events.py")]) == 1
    log = json.loads(capsys.readouterr().out)
    assert log["version"] == "2.1.0"
    assert log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [r.id for r in RULES]
    assert run["results"]
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] in ("warning", "error")
        assert result["message"]["text"]
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("bench_events.py")


def test_cli_directory_and_unparsable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "broken.py").write_text("def f(:\n    pass\n")
    (tmp_path / "pkg" / "model.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "dep.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    assert main(["--format", "json", str(tmp_path)]) == 1
    records = json.loads(capsys.readouterr().out)
    by_file = {(Path(r["path"]).name, r["rule"]) for r in records}
    assert by_file == {("broken.py", "FL000"), ("model.py", "FL022")}


def test_cli_diff_previews_and_fix_rewrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    source = "import torch\n\ndevice = 'cuda'\nx = torch.ones(2).cuda()\nok = torch.cuda.is_bf16_supported()\n"
    script.write_text(source)
    assert main(["--diff", str(script)]) == 1
    diff = capsys.readouterr().out
    assert diff.startswith(f"--- {script}\n+++ {script}\n")
    assert "\n-device = 'cuda'\n" in diff
    assert "\n+device = torch.accelerator.current_accelerator().type\n" in diff
    assert script.read_text() == source, "--diff writes nothing"
    assert main(["--fix", str(script)]) == 1, "the non-mechanical finding remains"
    out = capsys.readouterr().out
    assert "fixed 2 construct(s)" in out
    assert "FL027" in out
    assert [f.rule for f in check_source(script.read_text())] == ["FL027"]
    assert main(["--select", "FL010", str(script)]) == 0


def test_python_m_torch_fl_check(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import torch\ntorch.cuda.synchronize()\n")
    result = run_python(
        f"import sys, runpy\nsys.argv = ['torch_fl', 'check', {str(script)!r}]\n"
        "runpy.run_module('torch_fl', run_name='__main__')",
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert f"{script}:2:1: FL022" in result.stdout
    assert "fix: torch.accelerator.synchronize()" in result.stdout


def test_console_script_entry_point() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'torchfl-check = "torch_fl.check:main"' in pyproject
    assert callable(main)


def test_rule_table_documents_every_rule() -> None:
    doc = (ROOT / "docs" / "check-rules.md").read_text()
    rows = re.findall(r"^\| `?(FL\d{3})`? \|", doc, flags=re.M)
    assert rows == [rule.id for rule in RULES]
    for rule in RULES:
        assert rule.name in doc


def test_missing_libcst_is_a_clear_error(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("x = 1\n")
    result = run_python(
        f"""
        import sys
        sys.modules["libcst"] = None  # as if it were not installed
        from torch_fl.check import main
        sys.exit(main([{str(script)!r}]))
        """,
        timeout=120,
    )
    assert result.returncode == 2
    assert "pip install 'torch-fl[check]'" in result.stderr
