"""The corpus of broken plugins: each defect gives its own, specific error from register_device_plugin.

Every plugin is a variant of tests/plugins/fixture_plugin.c (one compile-time
define each, documented there); `torchfl-abi verify` is held to the same
corpus by crates/torchfl-abi/tests/cli.rs. Loading alone is checked in this
process with ``_native.load_plugin``; cases that must register a device (one
per process) or could take the process down run in a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torch_fl
from torch_fl import _native

from .conftest import DEVICE, assert_ok, run_python


def load(path: Path) -> _native.Plugin:
    """Loads and initializes a plugin without binding it to a device."""
    return _native.load_plugin(str(path))


def register(path: Path) -> None:
    """What a user calls; a refused plugin never reaches the (already registered) device."""
    torch_fl.register_device_plugin(name=DEVICE, plugin_path=path)


@pytest.mark.parametrize(
    ("variant", "defines", "error", "message"),
    [
        ("major_new", ["FIXTURE_ABI_MAJOR=2"], torch_fl.AbiVersionError, r"ABI 2\.0.*Upgrade torch-fl"),
        ("major_old", ["FIXTURE_ABI_MAJOR=0", "FIXTURE_ABI_MINOR=9"], torch_fl.AbiVersionError, r"ABI 0\.9.*Rebuild"),
        ("no_bootstrap", ["FIXTURE_NO_BOOTSTRAP"], torch_fl.MissingBootstrapSymbolError, "torch_fl_plugin_get_api"),
        ("null_api", ["FIXTURE_NULL_API"], torch_fl.InvalidPluginError, "NULL"),
        ("tiny_table", ["FIXTURE_TINY_TABLE"], torch_fl.InvalidPluginError, "struct_size"),
        ("null_allocate", ["FIXTURE_NULL_ENTRY=allocate"], torch_fl.MissingRequiredEntryError, r"\.allocate NULL"),
        ("init_fails", ["FIXTURE_INIT_FAILS"], torch_fl.PluginInitError, "no accelerator found on the PCI bus"),
        # A message that is not UTF-8: each invalid sequence becomes U+FFFD.
        (
            "init_fails_utf8",
            ["FIXTURE_INIT_FAILS", "FIXTURE_INVALID_UTF8"],
            torch_fl.PluginInitError,
            r"on the PCI bus \(injected\) \[caf\ufffd \ufffd \ufffd\]",
        ),
        ("missing_symbol", ["FIXTURE_MISSING_SYMBOL"], torch_fl.KernelSymbolError, "torch_fl_op_mul__Tensor"),
        ("wrong_symbol", ["FIXTURE_WRONG_SYMBOL_NAME"], torch_fl.KernelSymbolError, "my_add_kernel"),
    ],
)
def test_a_broken_plugin_is_refused_with_its_own_error(fixture_plugin, variant, defines, error, message) -> None:
    with pytest.raises(error, match=message) as info:
        register(fixture_plugin(variant, *defines))
    assert isinstance(info.value, torch_fl.PluginLoadError)


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "libtorchfl_nothing.so"
    with pytest.raises(torch_fl.PluginFileNotFoundError, match=r"libtorchfl_nothing\.so does not exist") as info:
        register(path)
    assert isinstance(info.value, FileNotFoundError)


def test_a_file_that_is_not_a_shared_library(tmp_path: Path) -> None:
    path = tmp_path / "libtorchfl_text.so"
    path.write_text("not a library\n")
    with pytest.raises(torch_fl.NotASharedLibraryError, match="no ELF header"):
        register(path)


def test_a_shared_library_for_another_architecture(fixture_plugin, tmp_path: Path) -> None:
    path = tmp_path / "libtorchfl_foreign.so"
    shutil.copy(fixture_plugin("good"), path)
    data = bytearray(path.read_bytes())
    foreign = 183 if data[18:20] != (183).to_bytes(2, "little") else 62  # aarch64, else x86_64
    data[18:20] = foreign.to_bytes(2, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(torch_fl.WrongArchitectureError, match=r"aarch64|x86_64"):
        register(path)


@pytest.mark.parametrize(
    ("variant", "defines", "effective"),
    [
        # A newer minor (1.9, larger tables): loads at this host's minor.
        ("newer_minor", ["FIXTURE_NEWER_TABLE"], "1.8"),
        # An older plugin whose table ends before the optional entries.
        ("older_table", ["FIXTURE_OLDER_TABLE"], "1.0"),
    ],
)
def test_a_compatible_version_mismatch_loads(fixture_plugin, variant, defines, effective) -> None:
    plugin = load(fixture_plugin(variant, *defines))
    assert plugin.abi_effective_version == effective
    assert "add.Tensor" in plugin.ops


def test_an_older_table_reads_as_unimplemented_optional_entries(fixture_plugin) -> None:
    plugin = load(fixture_plugin("older_table", "FIXTURE_OLDER_TABLE"))
    with pytest.raises(torch_fl.UnimplementedError, match="memory_stats"):
        plugin.memory_stats(0)


def run_on_fixture(path: Path, body: str, env: dict[str, str] | None = None) -> str:
    """Registers the fixture at `path` as device "fxdev" in a fresh process and runs `body`."""
    code = f"import torch, torch_fl\ntorch_fl.register_device_plugin(name='fxdev', plugin_path={str(path)!r})\n" + body
    return assert_ok(run_python(code, env=env))


@pytest.mark.parametrize(
    ("variant", "defines", "tail"),
    [
        ("failing_kernel", ["FIXTURE_FAILING_KERNEL"], ""),
        # A message that is not UTF-8 still raises the documented class.
        ("failing_kernel_utf8", ["FIXTURE_FAILING_KERNEL", "FIXTURE_INVALID_UTF8"], " [caf\ufffd \ufffd \ufffd]"),
    ],
)
def test_a_failing_kernel_raises_accelerator_error_with_its_message(fixture_plugin, variant, defines, tail) -> None:
    # Inside a PyTorch operation a failure the plugin reports raises what a
    # CUDA runtime failure raises: torch.AcceleratorError, a RuntimeError.
    path = fixture_plugin(variant, *defines)
    out = run_on_fixture(
        path,
        "import json\n"
        "a = torch.ones(3, device='fxdev')\n"
        "try:\n"
        "    torch.sub(a, a)\n"
        "except torch.AcceleratorError as e:\n"
        "    classes = [isinstance(e, RuntimeError), isinstance(e, torch_fl.TorchFLError)]\n"
        "    print(json.dumps([*classes, e.error_code, str(e)]))\n"
        "print(torch.add(a, a).sum().item())  # the device still works\n",
    )
    first, second = out.splitlines()[-2:]
    is_runtime_error, is_torch_fl_error, code, message = json.loads(first)
    assert is_runtime_error and not is_torch_fl_error
    assert code == 5  # TFL_ERROR_INTERNAL
    assert message.startswith(f"plugin 'minimal_c' ({path}): sub.Tensor failed (INTERNAL): "), message
    assert message.endswith(f"fixture: sub.Tensor failed on purpose{tail}"), message
    assert second == "6.0"


def test_an_allocation_beyond_capacity_is_an_out_of_memory_error(fixture_plugin) -> None:
    out = run_on_fixture(
        fixture_plugin("small_memory", "MINIMAL_CAPACITY=65536"),
        "try:\n"
        "    torch.empty(1 << 20, device='fxdev')\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('OOM', isinstance(e, torch_fl.TorchFLError), '|', e)\n"
        "x = torch.ones(16, device='fxdev')  # the device still works\n"
        "print(x.sum().item())\n",
    )
    assert out.startswith("OOM False |") and out.strip().endswith("16.0"), out
    # The plugin, the device, the size asked for and what is in use.
    assert "plugin 'minimal_c'" in out and "(OUT_OF_MEMORY)" in out, out
    assert "fxdev:0 could not allocate 4.00 MiB (0 bytes in use by tensors on this device)" in out, out


def test_a_crashing_kernel_is_reported_by_verify_without_taking_it_down(fixture_plugin) -> None:
    # register_device_plugin runs kernels in-process, as PyTorch does; the
    # vendor's tool to find such a kernel is `torchfl-abi verify`, which runs
    # the plugin in a child process.
    tool = Path(sys.executable).parent / "torchfl-abi"
    path = fixture_plugin("crashing", "FIXTURE_CRASHING_KERNEL")
    result = subprocess.run([str(tool), "verify", "--json", str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["abort"]["signal_name"] == "SIGSEGV", report["abort"]
    assert report["abort"]["check"] == "kernels"
    assert "div.Tensor" in report["abort"]["message"]
    # The message names the plugin that crashed.
    assert report["abort"]["message"].startswith(f"plugin 'minimal_c' ({path}) crashed with SIGSEGV")


def test_verify_flags_the_numerically_wrong_plugin(fixture_plugin) -> None:
    tool = Path(sys.executable).parent / "torchfl-abi"
    result = subprocess.run(
        [str(tool), "verify", str(fixture_plugin("wrong_numbers", "FIXTURE_WRONG_NUMBERS"))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "sub.Tensor" in result.stdout, result.stdout


def test_a_plugin_other_users_can_write_is_refused_unless_allowed(fixture_plugin, tmp_path) -> None:
    path = tmp_path / "libtorchfl_shared.so"
    shutil.copy(fixture_plugin("writable", 'FIXTURE_NAME="scratch"'), path)
    path.chmod(0o666)
    with pytest.raises(torch_fl.InsecurePluginError, match="writable by every user") as info:
        register(path)
    assert isinstance(info.value, PermissionError)
    assert "chmod o-w" in str(info.value) and "TORCH_FL_ALLOW_WRITABLE_PLUGINS=1" in str(info.value)
    out = assert_ok(
        run_python(
            f"""
            import torch_fl
            handle = torch_fl.register_device_plugin(name="scratch", plugin_path={str(path)!r})
            print(handle.name)
            """,
            env={"TORCH_FL_ALLOW_WRITABLE_PLUGINS": "1"},
        )
    )
    assert out.strip() == "scratch"


# --- Malformed declarations: refused or warned about, the same by verify -----


def verify(path: Path) -> tuple[int, dict]:
    """``torchfl-abi verify --json`` on ``path``: exit code and report."""
    tool = Path(sys.executable).parent / "torchfl-abi"
    result = subprocess.run([str(tool), "verify", "--json", str(path)], capture_output=True, text=True, timeout=300)
    return result.returncode, json.loads(result.stdout)


def without_addresses(text: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x…", text)


def check_detail(report: dict, check_id: str) -> tuple[str, str]:
    """The status and detail of one verify check."""
    check = next(c for c in report["checks"] if c["id"] == check_id)
    return check["status"], check["detail"]


@pytest.mark.parametrize(
    ("variant", "defines", "stage", "error", "message"),
    [
        (
            "ops_bytes",
            ["FIXTURE_OPS_COUNT_IN_BYTES"],
            "op_table",
            torch_fl.InvalidPluginError,
            r"op table entry 5 has a NULL name; it looks like the array's size in bytes \(5 entries of 64 bytes\)",
        ),
        (
            "ops_huge",
            ["FIXTURE_OPS_COUNT_HUGE"],
            "op_table",
            torch_fl.InvalidPluginError,
            r"num_entries is 1099511627776, more than TFL_MAX_OP_ENTRIES \(65536\)",
        ),
        (
            "ops_past_end",
            ["FIXTURE_OPS_COUNT_PAST_END"],
            "op_table",
            torch_fl.InvalidPluginError,
            r"op table entry 5 \(0x[0-9a-f]+, 64 bytes\) is not readable memory: num_entries \(6\) counts past the end",
        ),
        (
            "bootstrap_data",
            ["FIXTURE_BOOTSTRAP_IS_DATA"],
            "handshake",
            torch_fl.InvalidPluginError,
            r"torch_fl_plugin_get_api is not a function: it lies at 0x[0-9a-f]+, in the data of",
        ),
        (
            "info_size0",
            ["FIXTURE_INFO_STRUCT_SIZE_ZERO"],
            "identity",
            torch_fl.InvalidPluginError,
            r"TFL_PluginInfo.struct_size is 0, too small for the required fields",
        ),
        (
            "major_max",
            ["FIXTURE_ABI_MAJOR=0xFFFFFFFFu"],
            "handshake",
            torch_fl.InvalidPluginError,
            r"abi_major is 4294967295, which is not an ABI version",
        ),
        (
            "torch_banana",
            ['FIXTURE_MIN_TORCH_VERSION="banana"'],
            "identity",
            torch_fl.InvalidPluginError,
            r'min_torch_version "banana" is not a PyTorch version',
        ),
        (
            "null_stream",
            ["FIXTURE_NULL_DEFAULT_STREAM"],
            "streams",
            torch_fl.InvalidPluginError,
            r"default_stream\(0\) returned NULL",
        ),
    ],
)
def test_a_malformed_plugin_is_refused_alike_by_registration_and_verify(
    fixture_plugin, variant, defines, stage, error, message
) -> None:
    path = fixture_plugin(variant, *defines)
    with pytest.raises(error, match=message) as info:
        register(path)
    assert "Upgrade torch-fl" not in str(info.value)
    code, report = verify(path)
    assert code == 3 and report["outcome"] == "not_loaded", report
    assert [c["id"] for c in report["checks"] if c["status"] == "fail"] == [stage]
    # The same words: verify's check fails with registration's error (the
    # addresses differ from process to process).
    status, detail = check_detail(report, stage)
    assert (status, without_addresses(detail)) == ("fail", without_addresses(str(info.value)))


def test_files_that_are_not_plugins_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "libtorchfl_fifo.so"
    os.mkfifo(fifo)
    with pytest.raises(torch_fl.NotASharedLibraryError, match=r"it is a FIFO \(named pipe\), not a regular file"):
        register(fifo)
    loop = tmp_path / "libtorchfl_loop.so"
    loop.symlink_to(loop)
    with pytest.raises(torch_fl.NotASharedLibraryError, match="symbolic link that loops back on itself"):
        register(loop)
    dangling = tmp_path / "libtorchfl_dangling.so"
    dangling.symlink_to(tmp_path / "gone.so")
    with pytest.raises(torch_fl.PluginFileNotFoundError, match=r"it is a symbolic link to .*gone\.so, which does not"):
        register(dangling)
    for path in (fifo, loop, dangling):
        code, report = verify(path)
        assert code == 3 and check_detail(report, "file")[0] == "fail", report


WARNED = [
    ("unknown_aten", "FIXTURE_UNKNOWN_ATEN_OP", "op_table", "operator 'frobnicate.Tensor' is not an ATen operator"),
    ("bad_schema", "FIXTURE_BAD_SCHEMA", "op_table", "custom operator 'fx::scale' is not registered: its schema"),
    ("schema_name", "FIXTURE_SCHEMA_NAME_MISMATCH", "op_table", "declares 'scaled', not 'scale'"),
    ("zero_memory", "FIXTURE_ZERO_MEMORY", "device_properties", "device 0 reports total_memory = 0"),
]


def test_what_registration_warns_about_fails_verify_with_the_same_words(fixture_plugin) -> None:
    paths = [fixture_plugin(variant, define) for variant, define, _, _ in WARNED]
    out = assert_ok(
        run_python(
            f"""
            import json, warnings
            import torch_fl
            shown = []
            for path in {[str(p) for p in paths]!r}:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    torch_fl.register_device_plugin(name="fxdev", plugin_path=path)
                shown.append([str(w.message) for w in caught if issubclass(w.category, torch_fl.PluginWarning)])
            print(json.dumps(shown))
            """
        )
    )
    shown = json.loads(out.splitlines()[-1])
    for (variant, _, stage, message), path, warned in zip(WARNED, paths, shown):
        assert len(warned) == 1 and message in warned[0], (variant, warned)
        assert warned[0].startswith(f"plugin 'minimal_c' ({path}): "), warned
        code, report = verify(path)
        assert code == 1 and report["outcome"] == "failed", report
        status, detail = check_detail(report, stage)
        assert status == "fail", (variant, report)
        # The warning's text, word for word, after the plugin's label.
        # verify knows the ATen operators of the torch it was built for;
        # registration names the installed one (make test-torch runs others)
        said = re.sub(r"PyTorch \d+\.\d+\.\d+", "PyTorch <release>", warned[0].split(": ", 1)[1])
        assert said in re.sub(r"PyTorch \d+\.\d+\.\d+", "PyTorch <release>", detail), (variant, detail)


def test_a_plugin_without_devices_registers_as_unavailable(fixture_plugin) -> None:
    path = fixture_plugin("zero_devices", "FIXTURE_ZERO_DEVICES")
    out = run_on_fixture(
        path,
        "print(torch.fxdev.is_available(), torch.fxdev.device_count(), torch.device('fxdev').type)\n",
    )
    assert out.split() == ["False", "0", "fxdev"], out
    code, report = verify(path)
    assert code == 0 and report["outcome"] == "no_devices", report
    assert check_detail(report, "device_properties") == ("skip", "no devices, device checks skipped")
