"""A script that ends right after a backward pass exits cleanly.

Not marked ``runtime``: the scripts choose the simulator's synchronous mode
themselves, so the suite's strict and sync passes would repeat the same runs.
"""

from __future__ import annotations

from .conftest import run_python


def test_scripts_exit_cleanly_right_after_backward() -> None:
    # PyTorch's device autograd worker may drop the last reference to a
    # finished graph task while the interpreter finalizes; without
    # torch_fl's exit handler this aborted about one run in three.
    script = """
        import torch, torch_fl
        torch_fl.register_device_plugin(name="sim")
        model = torch.nn.Linear(3, 1).to("sim")
        model(torch.randn(2, 3).to("sim")).pow(2).mean().backward()
        """
    for _ in range(6):
        result = run_python(script, env={"TORCH_FL_SIM_MODE": "sync"})
        assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-500:]}"
