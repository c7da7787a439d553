"""Device graphs: capture once, replay without the host's per-operator cost (``torch.sim.graph``,
``torch.accelerator.Graph``, ``make_graphed_callables``).

A replay must do what eager execution does (training steps, decoding with a
KV cache, random operators with fresh numbers per replay), a capture must run
nothing, and what a capture cannot hold must raise, naming what it was.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_fl

from .conftest import assert_ok, run_python

# Exercises the device runtime: run again in the simulator's strict and sync modes.
pytestmark = pytest.mark.runtime


@pytest.fixture(params=["native", "shim"])
def replay(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A test that replays runs twice: with the simulator's native graphs (ABI 1.7), and kernel by kernel by torch-fl.

    Capture errors happen before a graph is instantiated, so those tests run once.
    """
    monkeypatch.setenv("TORCH_FL_GRAPHS", request.param)
    return str(request.param)


both_replays = pytest.mark.usefixtures("replay")


def capture(fn, **kw):  # type: ignore[no-untyped-def]
    """Captures ``fn()`` into a new graph; returns the graph and what ``fn`` returned."""
    g = torch.sim.Graph()
    with torch.sim.graph(g, **kw):
        out = fn()
    return g, out


@both_replays
def test_a_capture_runs_nothing_and_each_replay_reruns_the_work_on_the_static_tensors() -> None:
    static_x = torch.zeros(6, device="sim")
    result = torch.full((6,), -1.0, device="sim")
    g, y = capture(lambda: (result.copy_(static_x * 2 + 1), static_x.exp())[1])
    assert g.num_nodes() >= 3
    # Nothing ran: the out-of-place result still holds its old value.
    assert torch.equal(result.cpu(), torch.full((6,), -1.0))
    for step in range(3):
        values = torch.arange(6.0) + step
        static_x.copy_(values.to("sim"))
        g.replay()
        torch.testing.assert_close(result.cpu(), values * 2 + 1)
        torch.testing.assert_close(y.cpu(), values.exp())


@both_replays
def test_replay_equals_eager_for_a_training_step_with_an_optimizer() -> None:
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).to("sim")
    model.load_state_dict(cpu_model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.05, momentum=0.9)
    static_x = torch.randn(5, 8).to("sim")
    static_t = torch.randn(5, 4).to("sim")

    def step(m, o, x, t):  # type: ignore[no-untyped-def]
        o.zero_grad(set_to_none=False)
        loss = (m(x) - t).square().mean()
        loss.backward()
        o.step()
        return loss

    # Warm up (creates grads and momentum buffers) on the capture's stream.
    side = torch.sim.Stream()
    side.wait_stream(torch.sim.current_stream())
    with torch.sim.stream(side):
        step(model, opt, static_x, static_t)
    torch.sim.current_stream().wait_stream(side)
    step(cpu_model, cpu_opt, static_x.cpu(), static_t.cpu())

    g, static_loss = capture(lambda: step(model, opt, static_x, static_t), stream=side)
    for _ in range(3):
        x, t = torch.randn(5, 8), torch.randn(5, 4)
        static_x.copy_(x.to("sim"))
        static_t.copy_(t.to("sim"))
        g.replay()
        expected = step(cpu_model, cpu_opt, x, t)
        torch.testing.assert_close(static_loss.cpu(), expected.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


@both_replays
def test_a_decode_loop_with_a_static_kv_cache_replays_to_eager_tokens() -> None:
    torch.manual_seed(1)
    vocab, dim, ctx = 11, 16, 8
    emb, proj = torch.randn(vocab, dim), torch.randn(dim, vocab)

    def decode_step(token, pos, cache, emb, proj):  # type: ignore[no-untyped-def]
        # One token: write its key into the cache at `pos`, attend over
        # positions <= pos, pick the next token greedily. No host reads.
        h = emb.index_select(0, token)  # [1, dim]
        positions = torch.arange(ctx, device=cache.device)
        cache.copy_(torch.where((positions == pos).unsqueeze(1), h, cache))
        mask = positions <= pos
        scores = (cache @ h.t()).squeeze(1).masked_fill(~mask, float("-inf"))
        ctx_vec = torch.softmax(scores, 0) @ cache
        token.copy_((ctx_vec @ proj).argmax().reshape(1))
        pos.add_(1)

    # Eager on the CPU.
    token, pos, cache = torch.tensor([3]), torch.tensor([0]), torch.zeros(ctx, dim)
    expected = []
    for _ in range(ctx):
        decode_step(token, pos, cache, emb, proj)
        expected.append(int(token))

    d_emb, d_proj = emb.to("sim"), proj.to("sim")
    token, pos, cache = torch.tensor([3]).to("sim"), torch.tensor([0]).to("sim"), torch.zeros(ctx, dim).to("sim")
    g, _ = capture(lambda: decode_step(token, pos, cache, d_emb, d_proj))
    got = []
    for _ in range(ctx):
        g.replay()
        got.append(int(token.cpu()))
    assert got == expected


@both_replays
def test_dropout_draws_fresh_numbers_per_replay_and_reproduces_from_the_seed() -> None:
    ones = torch.ones(4096, device="sim")
    g, out = capture(lambda: F.dropout(ones, 0.5))
    torch.sim.manual_seed(7)
    g.replay()
    first = out.cpu().clone()
    g.replay()
    second = out.cpu().clone()
    assert not torch.equal(first, second)
    torch.sim.manual_seed(7)
    g.replay()
    assert torch.equal(out.cpu(), first)
    # The numbers are eager's: the replay right after the seed draws what
    # the eager call right after it does.
    torch.sim.manual_seed(7)
    assert torch.equal(F.dropout(ones, 0.5).cpu(), first)


@pytest.mark.parametrize(
    ("work", "names"),
    [
        (lambda x: x.sum().item(), "device-to-host copy"),
        (lambda x: x.cpu(), "device-to-host copy"),
        (lambda x: torch.tensor([1.0, 2.0], device="sim"), "host-to-device copy"),
        (lambda x: torch.sim.synchronize(), 'capture_error_mode="global"'),
        (lambda x: torch.sim.current_stream().synchronize(), "captured stream"),
        (lambda x: torch.erfinv(x), "aten::erfinv"),  # no simulator kernel: a CPU fallback
        (lambda x: torch.nonzero(x), "aten::nonzero"),
        (lambda x: x[x > 0], "aten::index.Tensor"),
    ],
    ids=["item", "cpu", "host-to-device", "synchronize", "stream-synchronize", "cpu-fallback", "nonzero", "mask"],
)
def test_what_a_capture_cannot_hold_raises_naming_it_and_the_graph_is_left_empty(work, names) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(8, device="sim")
    g = torch.sim.Graph()
    with pytest.raises(RuntimeError, match="device graph") as error:
        with torch.sim.graph(g):
            x.mul(2)
            work(x)
    assert names in str(error.value)
    assert not torch.sim.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="needs a finished capture"):
        g.replay()
    # The graph can capture again.
    with torch.sim.graph(g):
        y = x.mul(3)
    g.replay()
    torch.testing.assert_close(y.cpu(), x.cpu() * 3)


def test_an_error_caught_inside_the_capture_still_invalidates_it() -> None:
    x = torch.ones(4, device="sim")
    g = torch.sim.Graph()
    torch.sim.synchronize()
    with torch.sim.stream(torch.sim.Stream()):
        g.capture_begin()
        try:
            with pytest.raises(RuntimeError, match="device-to-host"):
                x.sum().item()
            with pytest.raises(RuntimeError, match="invalidated by an error raised inside it"):
                g.capture_end()
        finally:
            g.reset()  # ends the capture if the checks above failed
    assert not torch.sim.is_current_stream_capturing()


def test_relaxed_mode_allows_device_synchronization_but_never_of_the_captured_stream() -> None:
    x = torch.ones(4, device="sim")
    g, y = capture(lambda: (torch.sim.synchronize(), x + 1)[1], capture_error_mode="relaxed")
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.full((4,), 2.0))
    with pytest.raises(RuntimeError, match="captured stream"):
        capture(lambda: torch.sim.current_stream().synchronize(), capture_error_mode="relaxed")
    with pytest.raises(ValueError, match="capture_error_mode"):
        capture(lambda: None, capture_error_mode="lenient")


def test_without_the_caching_allocator_capture_refuses_with_what_to_do() -> None:
    out = assert_ok(
        run_python(
            """
            import torch, torch_fl
            torch_fl.register_device_plugin(name="sim")
            x = torch.ones(4, device="sim")
            try:
                with torch.sim.graph(torch.sim.Graph()):
                    x + 1
            except RuntimeError as e:
                print(e)
            """,
            env={"TORCH_FL_ALLOC_CONF": "backend:plugin"},
            timeout=120,
        )
    )
    assert "caching allocator" in out and "TORCH_FL_ALLOC_CONF" in out


def test_graphs_share_a_pool_and_give_their_memory_back_when_deleted() -> None:
    torch.sim.synchronize()
    torch.sim.empty_cache()
    before = torch.sim.memory_reserved()
    x = torch.ones(1 << 16, device="sim")
    g1, a = capture(lambda: x * 2)
    g2, b = capture(lambda a=a: a + 1, pool=g1.pool())
    assert g1.pool() == g2.pool() and g1.pool()[1] > 0
    pools = {tuple(s["segment_pool_id"]) for s in torch.sim.memory_snapshot(mempool_id=g1.pool())}
    assert pools == {g1.pool()}
    g1.replay()
    g2.replay()
    torch.testing.assert_close(b.cpu(), torch.full((1 << 16,), 3.0))
    # A handle shared by graphs captured later.
    handle = torch.sim.graph_pool_handle()
    g3, c = capture(lambda: x - 1, pool=handle)
    assert g3.pool() == handle
    shared = g1.pool()
    del g1, g2, g3, a, b, c
    torch.sim.empty_cache()
    assert not torch.sim.memory_snapshot(mempool_id=shared)
    assert not torch.sim.memory_snapshot(mempool_id=handle)
    assert torch.sim.memory_reserved() <= before + (2 << 20)  # x's segment at most


@both_replays
def test_two_streams_joined_by_events_replay_in_order() -> None:
    x = torch.arange(8.0, device="sim")

    def fork_join():  # type: ignore[no-untyped-def]
        main = torch.sim.current_stream()
        side = torch.sim.Stream()
        side.wait_stream(main)  # joins the capture
        with torch.sim.stream(side):
            a = x * 10
        b = x + 1
        main.wait_stream(side)  # joins it back
        return a + b

    g, out = capture(fork_join)
    g.replay()
    torch.testing.assert_close(out.cpu(), torch.arange(8.0) * 11 + 1)

    def unjoined():  # type: ignore[no-untyped-def]
        side = torch.sim.Stream()
        side.wait_stream(torch.sim.current_stream())
        with torch.sim.stream(side):
            x.mul(2)

    with pytest.raises(RuntimeError, match="never waited for"):
        capture(unjoined)


@both_replays
def test_a_graph_replays_on_whatever_stream_is_current() -> None:
    x = torch.ones(4, device="sim")
    g, y = capture(lambda: x * 5)
    other = torch.sim.Stream()
    with torch.sim.stream(other):
        g.replay()
    torch.sim.current_stream().wait_stream(other)
    torch.testing.assert_close(y.cpu(), torch.full((4,), 5.0))


def test_torch_accelerator_graph_captures_and_replays_on_the_device() -> None:
    x = torch.ones(4, device="sim")
    g = torch.accelerator.Graph()
    with torch.sim.stream(torch.sim.Stream()):
        with g:
            assert torch.accelerator.current_stream().is_capturing()
            y = x * 4
        assert not torch.accelerator.current_stream().is_capturing()
        g.replay()
    torch.sim.synchronize()
    torch.testing.assert_close(y.cpu(), torch.full((4,), 4.0))
    assert g.pool()[1] > 0


@both_replays
def test_make_graphed_callables_matches_eager_forward_and_backward() -> None:
    torch.manual_seed(2)
    eager = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3)).to("sim")
    graphed = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3)).to("sim")
    graphed.load_state_dict(eager.state_dict())
    sample = torch.randn(4, 6, device="sim", requires_grad=True)
    graphed = torch.sim.make_graphed_callables(graphed, (sample,))
    for _ in range(3):
        # As with CUDA's, a parameter's .grad may alias the graph's static
        # gradient, which the next replay overwrites: use it before then
        # (an optimizer step) and zero with set_to_none.
        graphed.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        x = torch.randn(4, 6, device="sim", requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        graphed(x).square().sum().backward()
        eager(x2).square().sum().backward()
        torch.testing.assert_close(x.grad.cpu(), x2.grad.cpu())
        for p, q in zip(graphed.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad.cpu())


def test_debug_dump_lists_the_recorded_launches(tmp_path) -> None:  # type: ignore[no-untyped-def]
    x = torch.ones(4, device="sim")
    g, _ = capture(lambda: (x * 2).exp())
    g.debug_dump(str(tmp_path / "graph.txt"))
    lines = (tmp_path / "graph.txt").read_text().splitlines()
    assert lines[0].startswith("# torch-fl device graph: 2 nodes")
    assert "mul" in lines[1] and "exp" in lines[2]


@both_replays
def test_the_static_kv_decoder_replayed_gives_generate_s_greedy_tokens() -> None:
    from torch_fl.lm import GPT, StaticDecoder, generate

    torch.manual_seed(3)
    model = GPT(layers=2).eval().to("sim")
    prompt = torch.randint(0, 64, (2, 4)).to("sim")
    expected = generate(model, prompt, 10, greedy=True)[:, 4:].cpu()
    decoder = StaticDecoder(model, batch=2)
    eager = [decoder.start(prompt).cpu().clone()] + [decoder.step().cpu().clone() for _ in range(9)]
    assert torch.equal(torch.cat(eager, dim=1), expected)
    decoder.start(prompt)
    first = decoder.token.cpu().clone()
    g, _ = capture(decoder.step)
    replayed = [first]
    for _ in range(9):
        g.replay()
        replayed.append(decoder.token.cpu().clone())
    assert torch.equal(torch.cat(replayed, dim=1), expected)


def test_the_replay_is_native_where_the_plugin_offers_graphs_unless_told_otherwise(replay: str) -> None:
    x = torch.ones(4, device="sim")
    g, y = capture(lambda: x + 1)
    assert g.native == (replay == "native")
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.full((4,), 2.0))


def test_a_graph_drawing_from_two_generators_replays_through_torch_fl(monkeypatch: pytest.MonkeyPatch) -> None:
    ones = torch.ones(256, device="sim")
    mine = torch.Generator(device="sim")
    monkeypatch.setenv("TORCH_FL_GRAPHS", "auto")
    g, (a, b) = capture(lambda: (F.dropout(ones, 0.5), torch.rand(256, device="sim", generator=mine)))
    assert not g.native  # one seed per native launch
    mine.manual_seed(1)
    torch.sim.manual_seed(2)
    g.replay()
    first = (a.cpu().clone(), b.cpu().clone())
    mine.manual_seed(1)
    torch.sim.manual_seed(2)
    g.replay()
    assert torch.equal(a.cpu(), first[0]) and torch.equal(b.cpu(), first[1])
    monkeypatch.setenv("TORCH_FL_GRAPHS", "native")
    g2 = torch.sim.Graph()
    with pytest.raises(RuntimeError, match="2 random generators"):
        with torch.sim.graph(g2):
            F.dropout(ones, 0.5), torch.rand(256, device="sim", generator=mine)
    monkeypatch.setenv("TORCH_FL_GRAPHS", "sometimes")
    with pytest.raises(ValueError, match="TORCH_FL_GRAPHS=sometimes is invalid"):
        capture(lambda: ones * 2)


def test_a_traced_replay_carries_the_plugins_records_of_its_kernels(replay: str) -> None:
    x = torch.ones(64, device="sim")
    g, y = capture(lambda: (x * 2).relu() + 1)
    g.replay()  # instantiates: the native build runs outside the trace
    torch.accelerator.synchronize()
    with torch_fl.trace() as t:
        g.replay()
    kernels = [r for e in t.events for r in e.native if r.kind == "kernel"]
    assert {r.name for r in kernels} >= {"mul.Tensor", "relu", "add.Tensor"}, kernels
    if replay == "native":
        # One traced call, the launch, and the graph's kernels under it.
        (launch,) = [e for e in t.events if e.name == "device graph replay"]
        assert launch.inputs == f"{g.num_nodes()} nodes"
        assert {r.name for r in launch.native if r.kind == "api"} == {"simGraphLaunch"}
        assert launch.device_begin_ns is not None and launch.device_begin_ns >= launch.host_begin_ns
    else:
        # Kernel by kernel, each a traced call as in eager execution.
        assert [e.name for e in t.events] == ["mul.Tensor", "relu", "add.Tensor"]
    torch.testing.assert_close(y.cpu(), torch.full((64,), 3.0))
