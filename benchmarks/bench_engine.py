"""Sampling time per RL step: the vLLM engine vs the fast decoder vs the HF forward path, and the
engine's weight-sync cost.

One rollout of an RL step (``Sampler.sample``: prompts in, a ``RolloutBatch`` with behaviour
log-probs out) is timed for each sampler on the same random-init Llama, the same ``reverse``
prompts and seeds, at two shapes:

* **small**: the tiny model (``TinyModelConfig()``: 2 layers, width 128), 8 prompts × 4 samples
  × 16 new tokens;
* **larger**: a Llama of 4 layers, width 256 (vocabulary of the harness tokenizer),
  16 prompts × 8 samples × 32 new tokens.

The stop set is the model's EOS (the engine refuses a stop id outside the vocabulary, so EOS
cannot be made unreachable as in ``bench_decode.py``): a random-init model stops a row with
probability ~1/100 per token, so the samplers generate slightly different token counts, and the
ratios compare time per generated token (the counts are shown). The samplers are timed interleaved (fast, hf,
engine, fast, ...) ``--repeats`` times after one warm-up round each, and the median is reported,
so machine load hits all alike. The engine's time excludes its weight sync, which is timed
separately (``EngineSampler.sync``: vLLM's in-place ``reload_weights`` of the full float32
weights; the engine is synced before every rollout in a run). Engine start (once per run) is
reported too. Reference for the ratios: the fast decoder (``rollout.sampler_backend: fast``).

    .venv/bin/python benchmarks/bench_engine.py                 # CPU, recorded
    .venv/bin/python benchmarks/bench_engine.py --device cuda   # a GPU (make bench-gpu)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _record import record  # noqa: E402

from harness.model.build import (  # noqa: E402
    TinyModelConfig,
    build_model,
    build_tokenizer,
    eos_ids,
    max_positions,
)
from harness.sampling import SamplingParams  # noqa: E402
from harness.sampling.local import LocalSampler, LocalSpec  # noqa: E402
from harness.sampling.vllm import EngineSampler, EngineSpec  # noqa: E402
from harness.sampling.vllm_host import reload_weights  # noqa: E402
from harness.tasks import get_task  # noqa: E402

CMD = ".venv/bin/python benchmarks/bench_engine.py"
SHAPES: dict[str, dict[str, Any]] = {
    "small": {
        "model": TinyModelConfig(),
        "prompts": 8,
        "samples": 4,
        "new": 16,
        "label": "tiny Llama (2 layers, width 128), 8 × 4 rows × 16 tokens",
    },
    "larger": {
        "model": TinyModelConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=512),
        "prompts": 16,
        "samples": 8,
        "new": 32,
        "label": "Llama (4 layers, width 256), 16 × 8 rows × 32 tokens",
    },
}


def rollout(
    sampler: Any, model: Any, tok: Any, prompts: list[str], s: dict[str, Any]
) -> tuple[float, int]:
    """Seconds for one rollout of the loaded weights (no sync: the version is unchanged) and
    the tokens it generated."""
    dev = sampler.device
    gen = torch.Generator(device=dev).manual_seed(0)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    sampler.load(model, 0)
    params = SamplingParams(n_samples=s["samples"], max_new_tokens=s["new"])
    rb = sampler.generate(tok, prompts, params, gen)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return dt, int(rb.loss_mask.sum())


def bench_shape(name: str, device: torch.device, repeats: int) -> dict[str, Any]:
    s = SHAPES[name]
    tok = build_tokenizer()
    model = build_model(tok, s["model"], seed=0).to(device).eval()
    kw = {"eos_token_ids": eos_ids(model, tok), "max_positions": max_positions(model.config)}
    prompts = [e.prompt for e in get_task("reverse").sample(random.Random(0), s["prompts"])]
    samplers: dict[str, Any] = {
        "fast": LocalSampler(device, LocalSpec(decoder="fast"), kw),
        "hf": LocalSampler(device, LocalSpec(decoder="hf"), kw),
    }
    engine = EngineSampler(device, EngineSpec(dtype="float32"), sample_kw=kw)
    t0 = time.perf_counter()
    engine.load(model, 0)  # starts it
    start = time.perf_counter() - t0
    samplers["engine"] = engine
    times: dict[str, list[float]] = {k: [] for k in samplers}
    tokens: dict[str, int] = {}
    syncs: list[float] = []
    try:
        for smp in samplers.values():  # warm-up
            rollout(smp, model, tok, prompts, s)
        for _ in range(repeats):
            for k, smp in samplers.items():
                dt, tokens[k] = rollout(smp, model, tok, prompts, s)
                times[k].append(dt)
            syncs.append(reload_weights(engine._llm, model))
    finally:
        engine.close()
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "label": s["label"],
        "med": med,
        "sync": statistics.median(syncs),
        "start": start,
        "mb": n_bytes / 2**20,
        "tokens": tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default="small,larger")
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    rows = []
    for name in args.shapes.split(","):
        r = bench_shape(name, device, args.repeats)
        m, n = r["med"], r["tokens"]
        per = {k: m[k] / max(1, n[k]) for k in m}  # seconds per generated token
        ref = per["fast"]
        cells = [
            f"{m[k] * 1e3:.0f} ms, {n[k]} tok ({per[k] / ref:.2f}×)"
            for k in ("fast", "hf", "engine")
        ]
        rows.append(
            f"| {r['label']} | {' | '.join(cells)} "
            f"| {r['sync'] * 1e3:.1f} ms ({r['sync'] / m['fast']:.2f}× a fast rollout; "
            f"{r['mb']:.1f} MiB) | {r['start']:.1f} |"
        )
        print(rows[-1], flush=True)
    table = (
        "| shape | fast decoder (ref) | HF forward | engine | weight sync "
        "| engine start s |\n|---|---|---|---|---|---|\n" + "\n".join(rows)
    )
    body = (
        f"Command: `{CMD}{'' if args.device == 'cpu' else ' --device ' + args.device}` "
        f"(device {args.device}, {args.threads} thread(s)). Milliseconds per rollout of one RL "
        f"step (median of {args.repeats}, interleaved, after a warm-up each) and the tokens it "
        "generated; in brackets the ratio of time per generated token to the fast decoder's. The engine's time excludes the weight sync, shown "
        "beside it (full float32 weights, vLLM's in-place reload). Engine start: its first "
        f"sync, including the model runner's start. 1-min load average {load:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after.\n\n" + table
    )
    print(table)
    if not args.no_record:
        record(f"Sampling per step: engine vs fast decoder vs HF ({args.device})", body)


if __name__ == "__main__":
    main()
