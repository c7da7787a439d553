"""torch_fl.test_compatibility and ``python -m torch_fl compat``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_fl
from torch_fl import _paths
from torch_fl.compat import CompatReport, find_opinfos, load_op_db

from .conftest import assert_ok, run_python

FAST_OPS = ["add.Tensor", "mul.Tensor", "relu", "sum.dim_IntList"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompatReport, Path]:
    out = tmp_path_factory.mktemp("compat")
    result = torch_fl.test_compatibility("sim", FAST_OPS, coverage=False, report_dir=out, progress=False)
    return result, out


def test_report_structure(report: tuple[CompatReport, Path]) -> None:
    result, _ = report
    assert result.passed, result.summary()
    assert [op.name for op in result.ops] == FAST_OPS
    for op in result.ops:
        assert op.status == "passed", (op.name, op.reason)
        assert op.samples_run > 0 and op.samples_failed == 0
        assert op.max_abs_error < 1e-4
    kinds = {c.kind for op in result.ops for c in op.checks}
    assert kinds == {"forward", "autograd"}, "gradients were compared too"
    add = result.ops[0]
    assert add.opinfos == ["add (function)"]
    assert {c.opinfo for c in add.checks} == {"add"}
    assert result.plugin["name"] == "sim" and result.dtypes == ["float32"]
    assert result.integrity is not None and result.integrity.passed
    assert {c["id"] for c in result.integrity.checks} >= {"handshake", "op_table"}
    assert "PASSED" in result.summary()


def test_reports_written(report: tuple[CompatReport, Path]) -> None:
    result, out = report
    data = json.loads((out / "compat.json").read_text())
    assert data["passed"] is True
    assert data["summary"]["ops"] == len(FAST_OPS) and data["summary"]["samples_failed"] == 0
    assert data["ops"][0]["name"] == "add.Tensor" and data["ops"][0]["checks"]
    assert data["integrity"]["passed"] is True
    page = (out / "compat.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert "add.Tensor" in page and "torchfl-abi verify" in page
    assert "http://" not in page and "https://" not in page, "self-contained"
    assert json.loads(result.to_json())["device"] == "sim"
    assert (out / "compat.txt").read_text().strip() == result.summary()


def test_operators_without_samples_are_not_failures(sim: torch_fl.PluginHandle) -> None:
    result = torch_fl.test_compatibility(
        sim, ["copy_", "uniform_", "sim::fused_bias_gelu"], coverage=False, integrity=False, progress=False
    )
    assert result.passed and result.device == "sim"
    assert [op.status for op in result.ops] == ["no_samples", "random", "custom"]
    assert all(op.reason for op in result.ops)


def test_opinfo_mapping() -> None:
    db = load_op_db()
    names = lambda op: {(i.name, v) for i, v in find_opinfos(op, db)}  # noqa: E731
    assert ("add", "function") in names("add.Tensor")
    assert ("add", "inplace") in names("add_.Tensor")
    assert ("nn.functional.conv2d", "function") in names("convolution_backward")
    assert ("nn.functional.relu", "function") in names("threshold_backward")
    assert names("_amp_update_scale_") == set()


def test_coverage_of_models() -> None:
    result = torch_fl.test_compatibility("sim", [], integrity=False, progress=False)
    assert result.coverage is not None
    resnet = next((m for m in result.coverage.models if m.model.startswith("resnet")), None)
    if importlib.util.find_spec("torchvision") is None:  # make test-torch under a torch without torchvision
        assert resnet is None
    else:
        assert resnet is not None and not resnet.error and resnet.device_fallbacks == {}
        assert {"convolution", "convolution_backward", "native_batch_norm"} <= set(resnet.native)
        assert resnet.fallback == [] and resnet.coverage_percent == 100.0
        assert resnet.max_abs_error is not None and resnet.max_abs_error < 1e-2
    encoder = next(m for m in result.coverage.models if m.model.startswith("Transformer"))
    assert not encoder.error and encoder.traced
    assert 0 < result.coverage.native_percent <= result.coverage.coverage_percent <= 100
    # The bar: every model the report traces runs natively, nothing falls back.
    for model in result.coverage.models:
        assert not model.error and model.traced, (model.model, model.error)
        assert model.fallback == [] and model.device_fallbacks == {}, (model.model, model.fallback)
    assert result.coverage.fallback == [] and result.coverage.coverage_percent == 100.0
    # The language models and the generation loop run natively end to end.
    lms = {
        m.model.split(" ")[0] + (" generation" if "generation" in m.model else ""): m for m in result.coverage.models
    }
    for name, expected in {
        "GPT": {"tril", "masked_fill.Scalar", "embedding_dense_backward"},
        "Llama": {"sin", "cos", "pow.Scalar", "rsqrt"},
        "BERT": {"where.self", "nll_loss_forward"},
        "GPT generation": {"multinomial", "topk", "cumsum", "scatter.src", "isin.Tensor_Tensor", "index.Tensor"},
    }.items():
        model = lms[name]
        assert not model.error and model.device_fallbacks == {}, (name, model.error, model.device_fallbacks)
        assert model.fallback == [] and model.coverage_percent == 100.0, (name, model.fallback)
        assert expected <= set(model.native), (name, expected - set(model.native))
        assert model.max_abs_error is not None and model.max_abs_error < 1e-3, (name, model.max_abs_error)


def test_a_numerically_wrong_plugin_is_flagged(tmp_path: Path) -> None:
    out = assert_ok(
        run_python(
            f"""
            import json, torch, torch_fl

            torch_fl.register_device_plugin(name="sim")
            lib = torch.library.Library("aten", "IMPL")

            def wrong_add(a, b, alpha=1):
                r = torch.add(a.cpu(), b.cpu() if isinstance(b, torch.Tensor) else b, alpha=alpha)
                return (r + 1e-3 * r.abs() + 1e-3).to(a.device)

            def wrong_sum(x, dim, keepdim=False, dtype=None):
                y = x.cpu().clone()
                if y.numel():
                    y.view(-1)[-1] = 0          # drops the last element
                return torch.sum(y, dim, keepdim, dtype=dtype).to(x.device)

            def broken_neg(x):
                raise RuntimeError("neg kernel exploded")

            lib.impl("add.Tensor", wrong_add, "PrivateUse1")
            lib.impl("sum.dim_IntList", wrong_sum, "PrivateUse1")
            lib.impl("neg", broken_neg, "PrivateUse1")
            report = torch_fl.test_compatibility(
                "sim", ["add.Tensor", "sum.dim_IntList", "mul.Tensor", "neg"], coverage=False, integrity=False,
                report_dir={str(tmp_path)!r},
            )
            print(report.summary())
            print("JSON", json.dumps(json.loads(report.to_json())))
            """
        )
    )
    assert "FAILED" in out
    data = json.loads(out.split("JSON ", 1)[1])
    assert data["passed"] is False
    ops = {op["name"]: op for op in data["ops"]}
    assert ops["mul.Tensor"]["status"] == "passed"
    for name in ("add.Tensor", "sum.dim_IntList"):
        op = ops[name]
        assert op["status"] == "failed", op
        assert op["samples_failed"] > 0 and op["max_abs_error"] > 1e-4
        failure = next(f for c in op["checks"] for f in c["failures"])
        assert "Tensor[" in failure["sample"], "the sample is described"
        assert "Mismatched elements" in failure["error"] or "differ" in failure["error"]
        assert failure["max_abs_error"] > 0
        assert f"FAIL {name}" in out
    neg = ops["neg"]
    assert neg["status"] == "failed"
    assert "raised on the device only" in neg["checks"][0]["failures"][0]["error"]
    assert "neg kernel exploded" in neg["checks"][0]["failures"][0]["error"]
    page = (tmp_path / "compat.html").read_text()
    assert "Failing samples" in page and "sum.dim_IntList" in page


def test_cli_passes_on_a_few_ops(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch_fl", "compat", "--ops", "add.Tensor,relu", "--no-coverage"]
    cmd += ["--plugin", str(_paths.SIM_PLUGIN), "--report-dir", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASSED" in result.stdout
    assert (tmp_path / "compat.json").exists() and (tmp_path / "compat.html").exists()


def test_cli_json_and_exit_code_for_a_plugin_that_cannot_load(tmp_path: Path) -> None:
    bad = tmp_path / "libbad.so"
    bad.write_text("nope")
    cmd = [sys.executable, "-m", "torch_fl", "compat", "--device", "bad", "--plugin", str(bad)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "could not be loaded" in result.stderr

    cmd = [sys.executable, "-m", "torch_fl", "compat", "--ops", "neg", "--no-coverage", "--no-integrity", "--json"]
    result = subprocess.run([*cmd, "--no-autograd"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["ops"][0]["name"] == "neg"
    assert {c["kind"] for c in data["ops"][0]["checks"]} == {"forward"}


def test_a_plugin_file_with_a_failing_kernel_and_a_failing_abi_check(fixture_plugin) -> None:
    plugin = fixture_plugin("compat", "FIXTURE_FAILING_KERNEL", "FIXTURE_WRONG_OOM_CODE")
    cmd = [sys.executable, "-m", "torch_fl", "compat", "--device", "fixture", "--plugin", str(plugin)]
    cmd += ["--ops", "sub.Tensor", "--no-coverage", "--no-autograd", "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["plugin"]["path"] == str(plugin)
    sub = data["ops"][0]
    assert sub["name"] == "sub.Tensor" and sub["status"] == "failed"
    failure = sub["checks"][0]["failures"][0]
    assert "raised on the device only" in failure["error"] and "failed on purpose" in failure["error"]
    integrity = data["integrity"]
    assert integrity["passed"] is False
    assert any(c["id"] == "out_of_memory" and c["status"] == "fail" for c in integrity["checks"])


def test_the_numerically_wrong_c_plugin_is_flagged_by_op_sample_and_error(fixture_plugin) -> None:
    plugin = fixture_plugin("wrong_numbers", "FIXTURE_WRONG_NUMBERS")
    cmd = [sys.executable, "-m", "torch_fl", "compat", "--device", "wrongdev", "--plugin", str(plugin)]
    cmd += ["--ops", "sub.Tensor,sum,add.Tensor", "--no-coverage", "--no-autograd", "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    ops = {op["name"]: op for op in json.loads(result.stdout)["ops"]}
    assert ops["add.Tensor"]["status"] == "passed", "the correct kernel beside the wrong ones passes"
    for name in ("sub.Tensor", "sum"):
        assert ops[name]["status"] == "failed", ops[name]
        failure = ops[name]["checks"][0]["failures"][0]
        assert failure["sample"], "the failing sample is described"
        assert "not close" in failure["error"] or "mismatch" in failure["error"].lower(), failure["error"]


def test_every_table_operator_passes_its_opinfo_samples(sim: torch_fl.PluginHandle) -> None:
    # The whole op table in float32 (forward and gradients): an operator
    # added to the table is checked here with no further step.
    result = torch_fl.test_compatibility(sim, coverage=False, integrity=False, progress=False)
    assert failures(result) == {}
    statuses = {op.name: op.status for op in result.ops}
    for name in LM_OPS_WITH_OPINFO:
        assert statuses[name] == "passed", (name, statuses[name])
    assert statuses["multinomial"] == statuses["randperm.generator_out"] == "random"


def test_index_sort_scan_and_integer_kernels_pass_in_int64(sim: torch_fl.PluginHandle) -> None:
    # topk is left out: with repeated values which indices it returns is
    # implementation-defined (the CPU's come from std::partial_sort, CUDA's
    # differ again); tests/test_language_model_operators.py checks its ties.
    ops = [op for op in LM_OPS_WITH_OPINFO if op not in ("topk", "sin", "cos")]
    result = torch_fl.test_compatibility(
        sim, ops, dtypes=(torch.int64,), coverage=False, integrity=False, progress=False
    )
    assert failures(result) == {}
    assert sum(op.samples_run for op in result.ops) > 100


def failures(result: CompatReport) -> dict[str, list[str]]:
    return {
        op.name: [f"{f.sample}: {f.error[:300]}" for c in op.checks for f in c.failures][:2]
        for op in result.ops
        if op.status == "failed"
    }


#: The language-model operators that PyTorch's OpInfo samples reach.
LM_OPS_WITH_OPINFO = [
    "arange.start_out", "tril", "triu", "flip", "sin", "cos", "pow.Scalar", "pow.Tensor_Tensor", "floor_divide",
    "floor_divide_.Tensor", "div.Tensor_mode", "remainder.Tensor", "cumsum", "cumprod", "sort.stable", "topk",
    "isin.Tensor_Tensor", "gather", "scatter.src", "scatter.value", "scatter_add", "index.Tensor",
    "_index_put_impl_",
]  # fmt: skip
