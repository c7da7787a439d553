"""Random state: torch.<name>'s seeds and generator states, as torch.cuda's, and torch.random.fork_rng."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from .conftest import DEVICE

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


@pytest.fixture(autouse=True)
def _restore_generators() -> Iterator[None]:
    # Tests here reseed every device; leave the generators as they were.
    states = torch.sim.get_rng_state_all()
    yield
    torch.sim.set_rng_state_all(states)
    torch.sim.set_device(0)


def draw(device: str) -> torch.Tensor:
    return torch.randn(16, device=device).cpu()


def test_manual_seed_all_seeds_every_device() -> None:
    torch.sim.manual_seed_all(42)
    assert torch.sim.initial_seed() == 42
    with torch.sim.device(1):
        assert torch.sim.initial_seed() == 42
    a0, a1 = draw("sim:0"), draw("sim:1")
    torch.sim.manual_seed_all(42)
    torch.testing.assert_close(draw("sim:0"), a0)
    torch.testing.assert_close(draw("sim:1"), a1)


def test_manual_seed_and_seed_touch_the_current_device_only() -> None:
    torch.sim.manual_seed_all(7)
    torch.sim.set_device(1)
    torch.sim.manual_seed(8)
    assert torch.sim.initial_seed() == 8
    torch.sim.set_device(0)
    assert torch.sim.initial_seed() == 7
    torch.sim.seed()
    assert torch.sim.initial_seed() != 7
    with torch.sim.device(1):
        assert torch.sim.initial_seed() == 8


def test_seed_all_gives_every_device_one_new_random_seed() -> None:
    torch.sim.seed_all()
    first = torch.sim.initial_seed()
    with torch.sim.device(1):
        assert torch.sim.initial_seed() == first
    torch.sim.seed_all()
    assert torch.sim.initial_seed() != first  # 64 random bits: equal only by a 2^-64 chance


def test_rng_states_of_all_devices_round_trip() -> None:
    states = torch.sim.get_rng_state_all()
    assert len(states) == torch.sim.device_count() == 2
    assert all(s.dtype == torch.uint8 and s.device.type == "cpu" for s in states)
    expected = draw("sim:0"), draw("sim:1")
    torch.sim.set_rng_state_all(states)
    torch.testing.assert_close(draw("sim:0"), expected[0])
    torch.testing.assert_close(draw("sim:1"), expected[1])


@pytest.mark.parametrize("where", [1, "sim:1", torch.device("sim", 1)])
def test_rng_state_of_one_device(where: int | str | torch.device) -> None:
    state = torch.sim.get_rng_state(where)
    expected = draw("sim:1")
    torch.sim.set_rng_state(state, where)
    torch.testing.assert_close(draw("sim:1"), expected)


def test_the_default_device_is_the_current_one() -> None:
    torch.sim.manual_seed_all(3)
    torch.sim.set_device(1)
    draw("sim:1")  # advances device 1 only
    assert torch.equal(torch.sim.get_rng_state(), torch.sim.get_rng_state(1))
    assert not torch.equal(torch.sim.get_rng_state(), torch.sim.get_rng_state(0))
    state = torch.sim.get_rng_state(0)
    torch.sim.set_rng_state(state)  # lands on device 1
    assert torch.equal(torch.sim.get_rng_state(1), state)


def test_fork_rng_restores_the_device_generators() -> None:
    torch.sim.manual_seed_all(5)
    before = draw("sim:0"), draw("sim:1")
    torch.sim.manual_seed_all(5)
    with torch.random.fork_rng(devices=[0, 1], device_type=DEVICE):
        torch.sim.manual_seed_all(99)
        inside = draw("sim:0")
    assert not torch.equal(inside, before[0])
    torch.testing.assert_close(draw("sim:0"), before[0])
    torch.testing.assert_close(draw("sim:1"), before[1])


def test_fork_rng_defaults_to_the_accelerator() -> None:
    # Without device_type, fork_rng forks torch.accelerator's device: this one.
    torch.sim.manual_seed_all(6)
    expected = draw("sim:0")
    torch.sim.manual_seed_all(6)
    with torch.random.fork_rng(devices=[0]):
        draw("sim:0")
    torch.testing.assert_close(draw("sim:0"), expected)


def test_torch_manual_seed_reaches_every_device() -> None:
    torch.manual_seed(11)
    assert torch.sim.initial_seed() == 11
    with torch.sim.device(1):
        assert torch.sim.initial_seed() == 11


def test_generators_on_a_device() -> None:
    g = torch.Generator(device="sim:1")
    assert g.device == torch.device("sim:1")
    g.manual_seed(42)
    assert g.initial_seed() == 42


def test_the_shim_hands_out_the_default_generator_object() -> None:
    # torch 2.13 lacks torch._C._accelerator_getDefaultGenerator; the device
    # module then asks the shim, which must return the very same object.
    from torch_fl import _C

    gen = _C.default_generator(0)
    assert isinstance(gen, torch.Generator) and gen.device == torch.device(DEVICE, 0)
    assert gen is _C.default_generator(0)
    if hasattr(torch._C, "_accelerator_getDefaultGenerator"):
        assert gen is torch._C._accelerator_getDefaultGenerator(0)
    torch.manual_seed(7)
    assert gen.initial_seed() == 7
    with pytest.raises(RuntimeError, match="device"):
        _C.default_generator(99)
