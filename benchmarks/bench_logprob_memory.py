"""Peak memory of a training step with a 152k vocabulary: chunked log-probs vs full log_softmax.

A random-init Qwen2 with Qwen2-0.5B's vocabulary (151,936) and a small trunk (2 layers, width
64), B = 32 sequences of L = 32 tokens (8 rows left-padded), float32 and bf16 autocast. One step =
``forward_logprobs`` with entropy -> PPO-like loss -> backward -> AdamW step. Reference: the
textbook ``log_softmax(logits.float())`` + gather + ``-(p * logp).sum()`` entropy (what
``harness.run.rollout.forward_logprobs`` did before ``harness.model.logprobs``). Each variant runs in a
fresh process; peak = ``ru_maxrss`` after the step minus RSS before it (Adam state already
allocated, one warm-up step of a different shape so the allocator's pools exist).

    .venv/bin/python benchmarks/bench_logprob_memory.py
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

VOCAB, B, L = 151_936, 32, 32
CMD = ".venv/bin/python benchmarks/bench_logprob_memory.py"


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def child(variant: str, dtype: str) -> dict[str, float]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.model.build import precision
    from harness.model.logprobs import forward_logprobs, naive_selected_logprobs, position_ids

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg).float()
    model.config._attn_implementation = "sdpa"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    amp = torch.bfloat16 if dtype == "bfloat16" else None

    def naive_forward(ids, att, with_entropy):
        out = model(input_ids=ids, attention_mask=att, position_ids=position_ids(att))
        lp, ent = naive_selected_logprobs(
            out.logits[:, :-1, :], ids[:, 1:], with_entropy=with_entropy
        )
        return lp, ent

    def step(ids, att):
        with precision("cpu", amp):
            if variant == "chunked":
                lp, ent = forward_logprobs(model, ids, att, with_entropy=True)
                lp, ent = lp[:, 1:], ent[:, 1:]
            else:
                lp, ent = naive_forward(ids, att, True)
            m = att[:, 1:].float()
            loss = -(lp * m).sum() / m.sum() - 0.01 * (ent * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (B, L), generator=g)
    att = torch.ones(B, L, dtype=torch.long)
    att[:8, :4] = 0
    step(ids[:2, :8], att[:2, :8])  # Adam state + allocator pools, tiny shape
    before = rss_mb()
    t0 = time.perf_counter()
    step(ids, att)
    first = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    times = [first]
    for _ in range(2):
        t0 = time.perf_counter()
        step(ids, att)
        times.append(time.perf_counter() - t0)
    return {"peak_mb": peak, "ms": 1000 * statistics.median(times)}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import os

    from _record import record

    logits_mb = B * L * VOCAB * 4 / 2**20
    load_before = os.getloadavg()[0]
    rows = []
    res: dict[tuple[str, str], dict[str, float]] = {}
    for dtype in ("float32", "bfloat16"):
        for variant in ("naive", "chunked"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", variant, dtype],
                capture_output=True,
                text=True,
                check=True,
            )
            res[variant, dtype] = json.loads(out.stdout.strip().splitlines()[-1])
            print(variant, dtype, res[variant, dtype], flush=True)
        n, c = res["naive", dtype], res["chunked", dtype]
        rows.append(
            f"| {dtype} | {n['peak_mb']:.0f} | {c['peak_mb']:.0f} | "
            f"**{n['peak_mb'] / c['peak_mb']:.2f}×** less | {n['ms']:.0f} | {c['ms']:.0f} |"
        )
    body = (
        f"Command: `{CMD}` (one thread, each variant in a fresh process).  Random-init "
        f"Qwen2 with a {VOCAB:,}-token vocabulary, 2 layers, width 64 (untied head: 19.5M "
        f"parameters, almost all embedding and head); B={B}, L={L}; one step = "
        "`forward_logprobs(with_entropy=True)` -> PPO-like loss -> backward -> AdamW.  Peak = "
        "`ru_maxrss` during the step minus RSS before it.  Reference: the textbook full "
        "float32 `log_softmax` + gather + `-(p·logp).sum()` entropy (the previous "
        f"`forward_logprobs`).  One float32 `[B, L, V]` tensor is {logits_mb:.0f} MB.  "
        f"1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after (the "
        "ms columns only mean something on an idle machine; the memory columns do not "
        "depend on load).\n\n"
        "| precision | peak, full log_softmax (MB) | peak, chunked (MB) | ratio | "
        "ms/step, full | ms/step, chunked |\n|---|---|---|---|---|---|\n" + "\n".join(rows)
    )
    record("Log-prob memory: chunked vs full log_softmax (152k vocabulary)", body)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
    else:
        main()
