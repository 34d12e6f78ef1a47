"""The real engine's training–inference mismatch against the autocast emulation's.

For each model (the tiny Llama, and a random-init 2-layer Qwen2 built from a config and saved to
a local directory: no download) and each sampler dtype (float32, bfloat16, float16), the same
prompts are sampled twice:

* **engine**: ``rollout.sampler_backend: vllm`` — the vLLM engine (``EngineSampler``) in that
  dtype, its weights and activations really in it, synced from the float32 policy;
* **emulation**: ``rollout.sampler_backend: fast`` with ``rollout.sampler_dtype`` — the
  in-process decoder under ``torch.autocast`` to that dtype over float32 weights.

Each batch's tokens are then scored by the float32 learner (``forward_logprobs``, no autocast),
and the batch's ``mismatch/*`` statistics are computed by the harness's own
``harness.metrics.mismatch.mismatch_stats`` (k3 = mean of w − log w − 1 with w = exp(ℓp − ℓb);
mean and max |ℓp − ℓb| over valid tokens). Temperature 1, top-p 1, one draw of
``--prompts × --samples`` rows of ``--new`` tokens (``reverse`` prompts, seed 0), one torch
thread. A dtype the engine refuses on this machine is reported as such.

    .venv/bin/python benchmarks/engine_mismatch.py
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _record import record  # noqa: E402

from harness.metrics.mismatch import mismatch_stats  # noqa: E402
from harness.model.build import (  # noqa: E402
    TinyModelConfig,
    build_model,
    build_tokenizer,
    eos_ids,
    max_positions,
)
from harness.model.logprobs import forward_logprobs  # noqa: E402
from harness.sampling import SamplingParams  # noqa: E402
from harness.sampling.local import LocalSampler, LocalSpec  # noqa: E402
from harness.sampling.vllm import EngineSampler, EngineSpec  # noqa: E402
from harness.sampling.vllm_host import EngineError  # noqa: E402
from harness.tasks import get_task  # noqa: E402

CMD = ".venv/bin/python benchmarks/engine_mismatch.py"
DTYPES = ("float32", "bfloat16", "float16")
TORCH = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


def qwen2(tokenizer: Any, workdir: str) -> Any:
    """A random-init Qwen2 (2 layers, width 128, grouped-query attention 4/2 heads of 32) sized
    to the harness tokenizer, saved with ``save_pretrained`` and loaded back from that directory.
    (Head size 16 — width 64 over 4 heads — is one the CPU engine's attention refuses.)"""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(workdir)
    model = AutoModelForCausalLM.from_pretrained(workdir, dtype=torch.float32)
    return model.eval()


def stats(model: Any, rb: Any) -> dict[str, float]:
    """The batch's mismatch against the float32 learner (both in token layout)."""
    with torch.no_grad():
        lp = forward_logprobs(model, rb.input_ids, rb.attention_mask, temperature=1.0)[0]
    mask = rb.loss_mask.bool()
    out = mismatch_stats(rb.logprobs.float(), lp.float(), mask)
    out["tokens"] = float(mask.sum())
    return out


def draw(sampler: Any, model: Any, tok: Any, prompts: list[str], args: Any) -> Any:
    sampler.load(model, 0)
    params = SamplingParams(n_samples=args.samples, max_new_tokens=args.new)
    return sampler.generate(tok, prompts, params, torch.Generator().manual_seed(args.seed))


def measure(name: str, model: Any, tok: Any, args: Any) -> list[tuple[str, ...]]:
    prompts = [e.prompt for e in get_task("reverse").sample(random.Random(args.seed), args.prompts)]
    kw = {"eos_token_ids": eos_ids(model, tok), "max_positions": max_positions(model.config)}
    rows = []
    for dtype in args.dtypes:
        emu = stats(
            model,
            draw(
                LocalSampler(torch.device("cpu"), LocalSpec(TORCH[dtype], "fast"), kw),
                model,
                tok,
                prompts,
                args,
            ),
        )
        engine = EngineSampler(
            torch.device("cpu"), EngineSpec(dtype=dtype, seed=args.seed), sample_kw=kw
        )
        t0 = time.perf_counter()
        try:
            eng: dict[str, float] | str = stats(model, draw(engine, model, tok, prompts, args))
        except EngineError as err:
            eng = f"refused: {str(err)[:160]}"
        finally:
            engine.close()
        dt = time.perf_counter() - t0
        for who, s in (("engine (vllm)", eng), ("emulation (fast + autocast)", emu)):
            if isinstance(s, str):
                rows.append((name, dtype, who, s, "", "", ""))
            else:
                rows.append(
                    (
                        name,
                        dtype,
                        who,
                        f"{s['mismatch/kl_k3']:.2e}",
                        f"{s['mismatch/logprob_abs_diff_mean']:.2e}",
                        f"{s['mismatch/logprob_abs_diff_max']:.2e}",
                        f"{int(s['tokens'])}",
                    )
                )
        print(f"  {name} {dtype}: engine {dt:.0f} s", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="tiny,qwen2")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args()
    args.dtypes = args.dtypes.split(",")
    torch.set_num_threads(args.threads)
    tok = build_tokenizer()
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            if name == "tiny":
                model = build_model(tok, TinyModelConfig(), seed=0).eval()
                label = "tiny Llama"
            else:
                model, label = qwen2(tok, d), "Qwen2 (2 layers, width 128)"
            rows += measure(label, model, tok, args)
    head = (
        "| model | sampler dtype | sampler | k3 KL | mean abs Δ log-prob | max abs Δ log-prob "
        "| tokens |\n|---|---|---|---|---|---|---|\n"
    )
    table = head + "\n".join("| " + " | ".join(r) + " |" for r in rows)
    print(table)
    if not args.no_record:
        body = (
            f"Learner: float32, no autocast. {args.prompts} prompts × {args.samples} samples × "
            f"{args.new} new tokens, temperature 1, seed {args.seed}, {args.threads} thread(s); "
            "one draw per cell.\n\n" + table + f"\n\n`{CMD}`"
        )
        record("Engine vs autocast emulation: mismatch (benchmarks/engine_mismatch.py)", body)


if __name__ == "__main__":
    main()
