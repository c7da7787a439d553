"""Device graphs against eager execution: batch-1 greedy decoding and a training step (a benchmark, not a test).

Decoding uses the small GPT of ``torch_fl.lm`` with :class:`torch_fl.lm.StaticDecoder`
(a static KV cache, one token per step, no host reads), as graph-captured
decoders do. It measures tokens per second:

- ``generate``: :func:`torch_fl.lm.generate`, the loop users write (the whole
  sequence through the model per token, ``cat`` to grow it);
- ``eager``: the static decoder's step run eagerly;
- ``replay``: the same step captured once into a device graph and replayed
  by torch-fl (``TORCH_FL_GRAPHS=shim``: one plugin kernel call per
  recorded launch, no Python, dispatcher or operator entry);
- ``native``: replayed as the simulator's native graph (ABI 1.7: one
  launch per replay, charged one launch latency by the cost model);

and a training step of the same GPT (forward, cross-entropy, backward,
AdamW with ``capturable=True``), eager against both replays, in ms per step.

Every figure is the median of ``--runs`` timed runs. By default the
simulator's default cost model is measured in this process and its
``pcie-gpu`` model (``TORCH_FL_SIM_COST_MODEL=pcie-gpu``: launch latency and
bandwidth of a discrete GPU) in a child process; ``--single`` measures only
the current environment. ``--json`` prints one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import torch_fl
from torch_fl.lm import GPT, StaticDecoder, generate


def _sync() -> None:
    torch.accelerator.synchronize()


def _median_rate(run: Callable[[], None], items: int, runs: int) -> float:
    """Items per second of ``run()`` (which does ``items`` items), the median of ``runs`` timings."""
    rates = []
    for _ in range(runs):
        _sync()
        start = time.perf_counter()
        run()
        _sync()
        rates.append(items / (time.perf_counter() - start))
    return statistics.median(rates)


def measure_decode(device: str, tokens: int, runs: int) -> dict[str, float]:
    """Tokens per second of generate(), the static decoder eagerly, and its step replayed as a graph."""
    torch.manual_seed(0)
    model = GPT().eval().to(device)
    prompt = torch.randint(0, 64, (1, 4)).to(device)
    decoder = StaticDecoder(model)
    per_sequence = model.context - prompt.shape[1]  # steps until the cache is full

    # Prefill once; each sequence then restarts right after the prompt (two
    # small device writes), so that the timings are of decoding steps.
    first = decoder.start(prompt).clone()

    def decode(step: Callable[[], Any]) -> None:
        done = 0
        while done < tokens:
            decoder.position.fill_(prompt.shape[1])
            decoder.token.copy_(first)
            for _ in range(min(per_sequence - 1, tokens - done)):
                step()
                done += 1

    # Warm up (output shapes, kernels), then capture one step, once per
    # way of replaying it (both work on the decoder's static tensors).
    decode(decoder.step)
    shim, native = capture_both(device, decoder.step)

    def generate_run() -> None:
        done = 0
        while done < tokens:
            n = min(per_sequence, tokens - done)
            generate(model, prompt, n, greedy=True, context=model.context)
            done += n

    return {
        "generate_tokens_per_s": _median_rate(generate_run, tokens, runs),
        "eager_tokens_per_s": _median_rate(lambda: decode(decoder.step), tokens, runs),
        "replay_tokens_per_s": _median_rate(lambda: decode(shim.replay), tokens, runs),
        "native_tokens_per_s": _median_rate(lambda: decode(native.replay), tokens, runs),
        "graph_nodes": shim.num_nodes(),
    }


def capture_both(device: str, step: Callable[[], Any], stream: Any = None) -> tuple[Any, Any]:
    """``step`` captured twice: a graph torch-fl replays, and one the plugin launches natively."""
    module = getattr(torch, device)
    graphs = []
    for mode in ("shim", "native"):
        os.environ["TORCH_FL_GRAPHS"] = mode  # read when the graph is instantiated
        graph = module.Graph()
        with module.graph(graph, stream=stream):
            step()
        graphs.append(graph)
    del os.environ["TORCH_FL_GRAPHS"]
    assert not graphs[0].native and graphs[1].native
    return graphs[0], graphs[1]


def measure_training(device: str, steps: int, runs: int) -> dict[str, float]:
    """Milliseconds per GPT training step, eager and replayed."""
    torch.manual_seed(0)
    model = GPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True, foreach=False)
    data = torch.randint(0, 64, (4, 17)).to(device)
    inputs, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(inputs).reshape(-1, 64), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    module = getattr(torch, device)
    side = module.Stream()
    side.wait_stream(module.current_stream())
    with module.stream(side):
        for _ in range(3):
            step()
    module.current_stream().wait_stream(side)
    shim, native = capture_both(device, step, side)

    def eager() -> None:
        for _ in range(steps):
            step()

    def replaying(graph: Any) -> Callable[[], None]:
        def run() -> None:
            for _ in range(steps):
                graph.replay()

        return run

    return {
        "eager_step_ms": 1e3 / _median_rate(eager, steps, runs),
        "replay_step_ms": 1e3 / _median_rate(replaying(shim), steps, runs),
        "native_step_ms": 1e3 / _median_rate(replaying(native), steps, runs),
        "graph_nodes": shim.num_nodes(),
    }


def measure(tokens: int, steps: int, runs: int) -> dict[str, Any]:
    """Every figure under the current environment."""
    torch_fl.register_device_plugin(name="sim")
    decode = measure_decode("sim", tokens, runs)
    train = measure_training("sim", steps, runs)
    return {
        "cost_model": os.environ.get("TORCH_FL_SIM_COST_MODEL", "default"),
        "decode": decode,
        "train": train,
        "decode_speedup": decode["replay_tokens_per_s"] / decode["eager_tokens_per_s"],
        "decode_native_speedup": decode["native_tokens_per_s"] / decode["eager_tokens_per_s"],
        "decode_speedup_over_generate": decode["replay_tokens_per_s"] / decode["generate_tokens_per_s"],
        "train_speedup": train["eager_step_ms"] / train["replay_step_ms"],
        "train_native_speedup": train["eager_step_ms"] / train["native_step_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    parser.add_argument("--tokens", type=int, default=600, help="tokens decoded per timed run")
    parser.add_argument("--steps", type=int, default=20, help="training steps per timed run")
    parser.add_argument("--runs", type=int, default=5, help="timed runs; figures are their median")
    parser.add_argument("--single", action="store_true", help="measure the current environment only")
    args = parser.parse_args()
    sizes = ["--tokens", str(args.tokens), "--steps", str(args.steps), "--runs", str(args.runs)]
    result: dict[str, Any] = {"default": measure(args.tokens, args.steps, args.runs)}
    if not args.single:
        child = subprocess.run(
            [sys.executable, __file__, "--json", "--single", *sizes],
            env={**os.environ, "TORCH_FL_SIM_COST_MODEL": "pcie-gpu"},
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
        )
        result["pcie-gpu"] = json.loads(child.stdout.strip().splitlines()[-1])["default"]
    if args.json:
        print(json.dumps(result, separators=(",", ":")))
        return
    for model, figures in result.items():
        d, t = figures["decode"], figures["train"]
        rates = f"generate {d['generate_tokens_per_s']:.0f}, eager {d['eager_tokens_per_s']:.0f}"
        replays = f"replay {d['replay_tokens_per_s']:.0f}, native {d['native_tokens_per_s']:.0f}"
        print(f"{model}: decode tokens/s {rates}, {replays} ({d['graph_nodes']} launches per token)")
        print(f"  replay {figures['decode_speedup']:.2f}x eager, native {figures['decode_native_speedup']:.2f}x")
        times = f"eager {t['eager_step_ms']:.2f}, replay {t['replay_step_ms']:.2f}, native {t['native_step_ms']:.2f}"
        print(f"  train step ms {times} ({figures['train_speedup']:.2f}x, {figures['train_native_speedup']:.2f}x)")


if __name__ == "__main__":
    main()
