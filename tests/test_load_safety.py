"""A plugin that hangs or kills the process while loading, and mistyped arguments.

A hung ``initialize`` is reported after ``TORCH_FL_INIT_TIMEOUT`` seconds
naming the plugin and the call, Ctrl-C interrupts the wait, and the stuck
thread holds no lock that would block later registrations. A plugin that
crashes or exits the process is named in the last line printed. Each case
runs in a fresh interpreter: these plugins register a device, leave a thread
behind or end the process.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import torch_fl

from .conftest import DEVICE, assert_ok, run_python

TIMEOUT = 240


def registering(path: Path, body: str = "") -> str:
    return f"import torch, torch_fl\ntorch_fl.register_device_plugin(name='fxdev', plugin_path={str(path)!r})\n{body}"


def test_a_hanging_initialize_times_out_naming_the_plugin_and_leaves_no_lock(fixture_plugin) -> None:
    hanging = fixture_plugin("hanging_init", "FIXTURE_HANGING_INIT")
    good = fixture_plugin("good")
    code = f"""
        import torch, torch_fl
        try:
            torch_fl.register_device_plugin(name='fxdev', plugin_path={str(hanging)!r})
        except torch_fl.PluginInitTimeoutError as e:
            assert isinstance(e, TimeoutError)
            print("TIMEOUT:", e)
        # Its thread is still inside initialize: a registration now must not
        # wait for it, nor for any lock it holds.
        torch_fl.register_device_plugin(name='fxdev', plugin_path={str(good)!r})
        print("ADD:", (torch.ones(3, device='fxdev') + 1).cpu().tolist())
        # The same stuck library again: it waits for the stuck thread's claim
        # (initialize must not run twice), bounded by the same limit.
        try:
            torch_fl._native.load_plugin({str(hanging)!r})
        except torch_fl.PluginInitTimeoutError as e:
            print("AGAIN:", e)
    """
    out = assert_ok(run_python(code, env={"TORCH_FL_INIT_TIMEOUT": "1.5"}, timeout=TIMEOUT))
    timeout_line = next(line for line in out.splitlines() if line.startswith("TIMEOUT:"))
    assert "plugin 'minimal_c'" in timeout_line and "hanging_init" in timeout_line, timeout_line
    assert "did not return from initialize within 1.5 s (TORCH_FL_INIT_TIMEOUT)" in timeout_line
    assert "left running" in timeout_line and "torchfl-abi verify" in timeout_line
    assert "ADD: [2.0, 2.0, 2.0]" in out
    again = next(line for line in out.splitlines() if line.startswith("AGAIN:"))
    assert "waiting for another thread initializing the same library" in again, again


def test_ctrl_c_interrupts_waiting_for_a_hanging_plugin(fixture_plugin) -> None:
    hanging = fixture_plugin("hanging_init", "FIXTURE_HANGING_INIT")
    code = f"""
        import os, signal, threading, time, torch_fl

        def thread_names():
            names = []
            for t in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{{t}}/comm") as f:
                        names.append(f.read().strip())
                except OSError:
                    pass  # the thread ended between listing and reading
            return names

        def interrupt_once_loading():
            # Wait until the loading thread exists, then press Ctrl-C.
            while "torchfl-load" not in thread_names():
                time.sleep(0.05)
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)

        # A process started in the background by a non-interactive shell
        # inherits SIGINT ignored, and Python then installs no
        # KeyboardInterrupt handler: install it, as an interactive run has it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Thread(target=interrupt_once_loading, daemon=True).start()
        try:
            torch_fl.register_device_plugin(name='fxdev', plugin_path={str(hanging)!r})
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
    """
    # No limit: only Ctrl-C can end the wait.
    out = assert_ok(run_python(code, env={"TORCH_FL_INIT_TIMEOUT": "0"}, timeout=TIMEOUT))
    assert "INTERRUPTED" in out


def test_an_unusable_timeout_setting_is_refused() -> None:
    code = "import torch_fl\ntorch_fl._native.load_plugin('/nonexistent/libx.so')\n"
    result = run_python(code, env={"TORCH_FL_INIT_TIMEOUT": "soon"}, timeout=TIMEOUT)
    assert result.returncode != 0
    assert "InvalidSettingError" in result.stderr
    assert 'TORCH_FL_INIT_TIMEOUT="soon" is not valid: expected a number of seconds > 0' in result.stderr


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


@pytest.mark.parametrize("faulthandler", [False, True], ids=["plain", "faulthandler"])
def test_a_plugin_crashing_in_initialize_is_named_last(fixture_plugin, faulthandler: bool) -> None:
    path = fixture_plugin("crashing_init", "FIXTURE_CRASHING_INIT")
    code = ("import faulthandler; faulthandler.enable()\n" if faulthandler else "") + registering(path)
    result = run_python(code, timeout=TIMEOUT)
    assert result.returncode == -signal.SIGSEGV, result.stderr
    line = last_line(result.stderr)
    assert line.startswith("torch-fl: fatal signal (SIGSEGV) while plugin 'minimal_c' ("), result.stderr
    assert "crashing_init" in line and "was running initialize: the plugin crashed" in line, line
    if faulthandler:
        # Python's traceback comes first, then the line naming the plugin.
        assert "Fatal Python error: Segmentation fault" in result.stderr


def test_a_plugin_exiting_in_initialize_is_named(fixture_plugin) -> None:
    path = fixture_plugin("exiting_init", "FIXTURE_EXITING_INIT")
    result = run_python(registering(path), timeout=TIMEOUT)
    assert result.returncode == 3, result.stderr
    line = last_line(result.stderr)
    assert "torch-fl: the process is exiting (exit()) while plugin 'minimal_c' (" in line, result.stderr
    assert "was running initialize: the plugin called exit()" in line


def test_a_kernel_crashing_the_process_is_named_with_its_operator(fixture_plugin) -> None:
    path = fixture_plugin("crashing_kernel", "FIXTURE_CRASHING_KERNEL")
    body = "a = torch.ones(4, device='fxdev')\nprint('BEFORE', flush=True)\nprint(a / a)\n"
    result = run_python(registering(path, body), timeout=TIMEOUT)
    assert result.returncode == -signal.SIGSEGV, result.stderr
    assert "BEFORE" in result.stdout
    line = last_line(result.stderr)
    assert "fatal signal (SIGSEGV) while plugin 'minimal_c' (" in line and "was running div.Tensor" in line, line


def test_the_crash_report_can_be_turned_off(fixture_plugin) -> None:
    path = fixture_plugin("crashing_init", "FIXTURE_CRASHING_INIT")
    result = run_python(registering(path), env={"TORCH_FL_CRASH_REPORT": "0"}, timeout=TIMEOUT)
    assert result.returncode == -signal.SIGSEGV
    assert "torch-fl: fatal signal" not in result.stderr


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"name": 3}, TypeError, "name must be a str"),
        ({"plugin_path": 3}, TypeError, "plugin_path must be a str or os.PathLike"),
        ({"priority": 2**31}, ValueError, r"priority must be between -2147483648 and 2147483647 .*got 2147483648"),
        ({"priority": -(2**31) - 1}, ValueError, "priority must be between"),
        ({"priority": "1"}, TypeError, "priority must be an int"),
        ({"priority": True}, TypeError, "priority must be an int"),
        ({"metadata": ["vendor"]}, TypeError, "metadata must be a mapping"),
        ({"metadata": {1: "x"}}, TypeError, "metadata keys must be str"),
        ({"metadata": {"colour": "red"}}, torch_fl.MetadataMismatchError, "'colour' .* the known keys are name, "),
        ({"metadata": {"vendor": None}}, TypeError, r"metadata\['vendor'\] must be a str"),
    ],
)
def test_mistyped_or_out_of_range_arguments_are_refused_before_loading(kwargs, error, message) -> None:
    arguments = {"name": DEVICE, **kwargs}
    with pytest.raises(error, match=message):
        torch_fl.register_device_plugin(**arguments)


def test_a_version_number_is_accepted_as_metadata() -> None:
    # A number compares as the version it spells: 1.2 equals "1.2.0".
    abi = float(".".join(torch_fl._native.ABI_VERSION.split(".")[:2]))
    handle = torch_fl.register_device_plugin(name=DEVICE, metadata={"abi_version": abi})
    assert handle.device == DEVICE
