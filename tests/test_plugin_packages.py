"""Plugins installed as Python packages: discovery, autoload on ``import torch``, listing, the info report.

The C example (examples/c_plugin, ``torchfl-abi new``'s project for the device
``minimal_c``: a plugin package with a ``torch_fl.plugins`` entry point) is
built and installed with pip into a directory of its own, which the subprocesses put on their path;
the broken packages are distribution metadata written by the tests. Every
case runs in a fresh interpreter: autoload happens during ``import torch``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import assert_ok, run_python

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 240
ORIGIN = "the plugin package torchfl-minimal-c 0.1.0 (entry point minimal_c = torchfl_minimal_c:plugin)"


@pytest.fixture(scope="module")
def vendor_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/c_plugin, built and installed with pip into its own directory."""
    site = tmp_path_factory.mktemp("vendor_site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(ROOT / "examples" / "c_plugin"),
        ],
        check=True,
        timeout=TIMEOUT,
    )
    return site


def fake_package(site: Path, name: str, entry_point: str, module: str | None = None) -> None:
    """Writes an installed distribution ``name`` declaring ``entry_point`` (and a module, when given)."""
    dist = site / f"{name}-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[torch_fl.plugins]\n{entry_point}\n")
    if module is not None:
        (site / f"{name}.py").write_text(module)


def run(code: str, *sites: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(s) for s in sites] + [os.environ.get("PYTHONPATH", "")])
    return run_python(code, env={"PYTHONPATH": path, **env}, timeout=TIMEOUT)


def test_register_by_name_finds_the_package(vendor_site: Path) -> None:
    code = """
        import torch, torch_fl
        h = torch_fl.register_device_plugin(name="minimal_c")
        print("ORIGIN", h.origin)
        print("ADD", (torch.ones(3, device="minimal_c") + 1).cpu().tolist())
    """
    out = assert_ok(run(code, vendor_site, TORCH_FL_AUTOLOAD="0"))
    assert f"ORIGIN {ORIGIN}" in out
    assert "ADD [2.0, 2.0, 2.0]" in out


def test_torch_fl_plugin_path_comes_before_packages(vendor_site: Path, fixture_plugin, tmp_path: Path) -> None:
    # A file of the same plugin name in TORCH_FL_PLUGIN_PATH wins (discovery order).
    library = tmp_path / "libminimal_c.so"
    library.write_bytes(fixture_plugin("minimal_again").read_bytes())
    code = """
        import torch_fl
        print("ORIGIN", torch_fl.register_device_plugin(name="minimal_c").origin)
    """
    out = assert_ok(run(code, vendor_site, TORCH_FL_AUTOLOAD="0", TORCH_FL_PLUGIN_PATH=str(library)))
    assert f"ORIGIN TORCH_FL_PLUGIN_PATH ({library})" in out


def test_import_torch_alone_makes_the_device_usable_and_initializes_at_first_use(vendor_site: Path) -> None:
    code = """
        import torch
        from torch_fl import _native
        print("BEFORE", _native.plugin_initialized(), torch.device("minimal_c:0"))
        x = torch.ones(2, device="minimal_c")
        print("AFTER", _native.plugin_initialized(), (x + x).cpu().tolist(), torch.minimal_c.device_count())
        print("TENSOR", torch.zeros(1).minimal_c().device)
    """
    out = assert_ok(run(code, vendor_site))
    assert "BEFORE False minimal_c:0" in out
    assert "AFTER True [2.0, 2.0] 1" in out
    assert "TENSOR minimal_c:0" in out


def test_the_device_module_registers_the_plugin_at_first_use(vendor_site: Path) -> None:
    code = """
        import torch
        print("COUNT", torch.minimal_c.device_count(), torch.accelerator.device_count())
    """
    assert "COUNT 1 1" in assert_ok(run(code, vendor_site))


@pytest.mark.parametrize("env", [{"TORCH_FL_AUTOLOAD": "0"}, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}])
def test_autoload_can_be_turned_off(vendor_site: Path, env: dict[str, str]) -> None:
    code = """
        import torch
        print("HAS", hasattr(torch, "minimal_c"))
    """
    assert "HAS False" in assert_ok(run(code, vendor_site, **env))


def test_the_bundled_sim_autoloads_only_when_named() -> None:
    code = "import torch\nprint('HAS', hasattr(torch, 'sim'))\n"
    assert "HAS False" in assert_ok(run(code))
    out = assert_ok(run(code + "print((torch.ones(2, device='sim') * 3).cpu().tolist())\n", TORCH_FL_DEVICE="sim"))
    assert "HAS True" in out and "[3.0, 3.0]" in out


BROKEN = [
    (
        "missing_module",
        "brokenpkg = no_such_module:plugin",
        None,
        "ModuleNotFoundError: No module named 'no_such_module'",
    ),
    (
        "failing_object",
        "brokenpkg = brokenpkg:plugin",
        "def plugin():\n    raise OSError('the driver is not installed')\n",
        "OSError: the driver is not installed",
    ),
    ("not_a_file", "brokenpkg = brokenpkg:plugin", "def plugin():\n    return '/nonexistent/libx.so'\n", "not a file"),
]


@pytest.mark.parametrize(("case", "entry_point", "module", "cause"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_package_leaves_import_torch_working_with_one_warning(
    tmp_path: Path, case: str, entry_point: str, module: str | None, cause: str
) -> None:
    fake_package(tmp_path, "brokenpkg", entry_point, module)
    code = """
        import torch
        print("OK", torch.ones(2).sum().item(), hasattr(torch, "brokenpkg"))
    """
    result = run(code, tmp_path)
    out = assert_ok(result)
    assert "OK 2.0 False" in out
    warnings = [line for line in result.stderr.splitlines() if "torch-fl: autoloading" in line]
    assert len(warnings) == 1, result.stderr
    assert "plugin package brokenpkg 1.0 (entry point brokenpkg = " in warnings[0], warnings[0]
    assert cause in warnings[0], warnings[0]


def test_a_package_with_a_mismatched_abi_leaves_import_torch_working(tmp_path: Path, fixture_plugin) -> None:
    library = fixture_plugin("major_new", "FIXTURE_ABI_MAJOR=2")
    fake_package(tmp_path, "minimal_c", "minimal_c = newabi:plugin", None)
    (tmp_path / "newabi.py").write_text(f"def plugin():\n    return {str(library)!r}\n")
    result = run("import torch\nprint('OK', hasattr(torch, 'minimal_c'))\n", tmp_path)
    assert "OK False" in assert_ok(result)
    (warning,) = [line for line in result.stderr.splitlines() if "torch-fl: autoloading" in line]
    assert "AbiVersionError" in warning and "ABI 2.0" in warning, warning


def packaged(site: Path, name: str, library: Path, priority: int) -> None:
    """A plugin package ``name`` (its device) for ``library``, asking for ``priority``."""
    module = f"def plugin():\n    return {{'path': {str(library)!r}, 'priority': {priority}}}\n"
    fake_package(site, f"pkg_{name}", f"{name} = pkg_{name}:plugin", module)


@pytest.fixture
def one_image(tmp_path: Path, vendor_site: Path, fixture_plugin) -> tuple[Path, Path]:
    """One image for several kinds of instance: plugin packages of which only minimal_c has its hardware here.

    nodev counts no device, nodrv's driver is missing (both ask for a higher
    priority than minimal_c's 0), and a package for the bundled simulator
    asks for the highest: autoload must pass all three over.
    """
    site = tmp_path / "image"
    packaged(site, "nodev", fixture_plugin("nodev", 'FIXTURE_NAME="nodev"', "FIXTURE_ZERO_DEVICES"), 30)
    packaged(site, "nodrv", fixture_plugin("nodrv", 'FIXTURE_NAME="nodrv"', "FIXTURE_PROBE_NO_DRIVER"), 20)
    import torch_fl

    packaged(site, "sim", Path(torch_fl.__file__).parent / "_lib" / "libtorchfl_sim.so", 100)
    return site, vendor_site


def test_several_packages_autoload_the_one_whose_hardware_is_present(one_image: tuple[Path, Path]) -> None:
    code = """
        import torch
        print("HAS", [name for name in ("minimal_c", "nodev", "nodrv", "sim") if hasattr(torch, name)])
        print("ADD", (torch.ones(2, device="minimal_c") + 1).cpu().tolist())
    """
    result = run(code, *one_image)
    out = assert_ok(result)
    assert "HAS ['minimal_c']" in out and "ADD [2.0, 2.0]" in out
    # Probing asked nodrv's driver and never initialized the plugin.
    assert "fixture: probe_devices called" in result.stderr
    assert "fixture: initialize called" not in result.stderr
    assert "several plugin packages" not in result.stderr and "autoloading" not in result.stderr, result.stderr


def test_info_shows_every_autoload_candidate_and_why(one_image: tuple[Path, Path]) -> None:
    path = os.pathsep.join([*map(str, one_image), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "torch_fl", "info", "--json"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    auto = json.loads(result.stdout)["autoload"]
    assert auto["device"] == "minimal_c" and auto["why"] == "by the hardware present and priority"
    why = {c["name"]: (c["chosen"], c["devices"], c["reason"]) for c in auto["candidates"]}
    assert [c["name"] for c in auto["candidates"]] == ["sim", "nodev", "nodrv", "minimal_c"]  # by priority
    assert why["sim"] == (False, None, "the simulator is used only when named")
    assert why["nodev"][:2] == (False, 0) and "no device present" in why["nodev"][2]
    assert why["nodrv"][0] is False and "install fixture-driver-dkms" in why["nodrv"][2]
    assert why["minimal_c"][:2] == (True, 1) and why["minimal_c"][2].startswith("chosen: 1 device(s)")
    text = subprocess.run(
        [sys.executable, "-m", "torch_fl", "info"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert "autoload:         minimal_c (by the hardware present and priority)" in text.stdout, text.stdout
    assert "nodrv        passed over" in text.stdout, text.stdout


def test_priority_decides_among_plugins_whose_hardware_is_present(
    tmp_path: Path, vendor_site: Path, fixture_plugin
) -> None:
    packaged(tmp_path, "fixhi", fixture_plugin("fixhi", 'FIXTURE_NAME="fixhi"'), 5)
    code = """
        import torch, torch_fl
        print("HAS", hasattr(torch, "fixhi"), hasattr(torch, "minimal_c"))
        try:
            torch_fl.register_device_plugin(name="minimal_c")
        except torch_fl.TorchFLError as e:
            print("REFUSED", type(e).__name__, "|", e)
    """
    out = assert_ok(run(code, tmp_path, vendor_site))
    assert "HAS True False" in out
    # The device slot is taken: today's clear error, naming the device.
    assert "REFUSED DeviceNameConflictError" in out and "fixhi" in out, out
    named = run(
        "import torch\nprint('HAS', hasattr(torch, 'minimal_c'))\n", tmp_path, vendor_site, TORCH_FL_DEVICE="minimal_c"
    )
    assert "HAS True" in assert_ok(named)


def test_a_plugin_older_than_the_probe_entry_is_taken_to_have_its_hardware(
    tmp_path: Path, vendor_site: Path, fixture_plugin
) -> None:
    # A 1.5-sized function table (no probe_devices): it loads unchanged, and
    # autoload cannot tell without initializing, so its priority decides.
    library = fixture_plugin("noprobe", 'FIXTURE_NAME="noprobe"', "FIXTURE_NO_PROBE")
    packaged(tmp_path, "noprobe", library, 3)
    out = assert_ok(
        run(
            "import torch\nprint('HAS', hasattr(torch, 'noprobe'), torch.ones(2, device='noprobe').device)\n",
            tmp_path,
            vendor_site,
        )
    )
    assert "HAS True noprobe:0" in out
    code = "from torch_fl.selection import autoload_choice\nprint(autoload_choice(probe_all=True))\n"
    choice = assert_ok(run(code, tmp_path, vendor_site))
    assert "devices assumed present (no probe_devices entry)" in choice, choice


def test_no_package_with_its_hardware_present_leaves_no_device_and_one_warning(tmp_path: Path, fixture_plugin) -> None:
    packaged(tmp_path, "nodev", fixture_plugin("nodev", 'FIXTURE_NAME="nodev"', "FIXTURE_ZERO_DEVICES"), 0)
    packaged(tmp_path, "nodrv", fixture_plugin("nodrv", 'FIXTURE_NAME="nodrv"', "FIXTURE_PROBE_NO_DRIVER"), 0)
    result = run("import torch\nprint('OK', torch.ones(2).sum().item(), hasattr(torch, 'nodev'))\n", tmp_path)
    assert "OK 2.0 False" in assert_ok(result)
    (warning,) = [line for line in result.stderr.splitlines() if "several plugin packages" in line]
    assert "(nodev, nodrv) and none has its hardware present" in warning, warning
    assert "nodev: no device present" in warning and "fixture-driver-dkms" in warning, warning
    assert "TORCH_FL_DEVICE" in warning


def test_list_plugins_reports_every_source_without_initializing(vendor_site: Path, tmp_path: Path) -> None:
    fake_package(tmp_path, "brokenpkg", "brokenpkg = no_such_module:plugin")
    code = """
        import torch_fl
        from torch_fl import _native
        for p in torch_fl.list_plugins():
            print("ROW", p.name, p.status, p.abi_version, "|", p.source, "|", p.detail)
        print("INITIALIZED", _native.plugin_initialized())
    """
    out = assert_ok(run(code, vendor_site, tmp_path, TORCH_FL_AUTOLOAD="0"))
    rows = [line for line in out.splitlines() if line.startswith("ROW")]
    assert any(r.startswith("ROW minimal_c available 1.") and "package torchfl-minimal-c 0.1.0" in r for r in rows)
    assert any(r.startswith("ROW sim available") and "| bundled |" in r for r in rows), rows
    assert any(r.startswith("ROW brokenpkg error None") and "No module named 'no_such_module'" in r for r in rows)
    assert "INITIALIZED False" in out


def test_info_reports_the_environment(vendor_site: Path) -> None:
    env = {
        "PYTHONPATH": os.pathsep.join([str(vendor_site), os.environ.get("PYTHONPATH", "")]),
        "TORCH_FL_LOG": "fallback",
    }
    full_env = {**os.environ, **env}
    plain = subprocess.run(
        [sys.executable, "-m", "torch_fl", "info"], env=full_env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert plain.returncode == 0, plain.stderr
    assert "torch-fl:" in plain.stdout and "plugin ABI" in plain.stdout
    assert "minimal_c" in plain.stdout and "TORCH_FL_LOG=fallback" in plain.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "torch_fl", "info", "--json"],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    report = json.loads(as_json.stdout)
    assert report["torch_installed"].startswith("2.")
    names = {p["name"]: p for p in report["plugins"]}
    assert names["minimal_c"]["status"] == "available" and names["sim"]["source"] == "bundled"
    assert report["environment"]["TORCH_FL_LOG"] == "fallback"
