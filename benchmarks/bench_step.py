"""One RL step: the harness's PPO step vs TRL's GRPOTrainer vs a minimal plain-torch loop.

All three run in this one process, on the same tiny Llama (``build_model(build_tokenizer(),
TinyModelConfig(), seed=0)``, a fresh copy per contender), the same ``reverse`` prompts, the same
trivial deterministic reward (the fraction of digits in a completion), AdamW at lr 3e-4, one
optimizer step per batch, temperature 1 with no top-k/top-p, on one torch thread (``--threads``).

Contenders (ms per step = median of the measured steps, after warm-up steps):

* **harness**: the loop body of ``harness.run.loop.run`` with the same functions, in the same order:
  ``task.sample`` -> ``harness.sampling.local.sample`` -> scoring -> ``PPOActor.compute_advantages`` ->
  ``PPOActor.ppo_update`` (``ppo_n_minibatches=1``, one epoch, grad clip 1.0, group reward
  normalisation as GRPO does) -> the loop's finiteness checks and per-step metrics dict.
  Evaluation is excluded (``train.run`` times its steps before evaluating, too).
  A cross-check row runs the real ``harness.run.loop.run`` for the same number of steps (its own
  tokenizer and the real ``reverse`` score, so EOS is possible there) and reports the median of
  its ``perf/step_time`` metric.
* **TRL**: ``trl.GRPOTrainer`` with ``GRPOConfig(use_cpu=True, bf16=False,
  gradient_checkpointing=False, report_to="none", num_iterations=1, beta=0.0,
  per_device_train_batch_size=prompts*samples, num_generations=samples, ...)``; a
  ``TrainerCallback`` takes the time at every ``on_step_end``; the per-step time is the gap
  between consecutive step ends (so it includes the data loader, generation, scoring, loss,
  backward, clipping, optimizer and Trainer bookkeeping).  tqdm is disabled.
* **plain**: ``model.generate(do_sample=True)`` -> one forward for log-probs -> REINFORCE loss with
  group-normalised advantages -> backward -> ``AdamW.step``.  No grad clipping, no metrics.

Equal token counts: EOS is made unreachable for every contender.  The model is built with the
100-token character vocabulary; afterwards the tokenizer's EOS becomes a new token ``<never>``
(id 100, outside the model's vocabulary, so it is never sampled) and the model's
``generation_config.eos_token_id`` follows.  Every row of every contender therefore generates
exactly ``max_new_tokens`` tokens, with each sampler's ordinary EOS checks still in place.

    .venv/bin/python benchmarks/bench_step.py
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _record import record  # noqa: E402

from harness.config import PPOActorConfig, build_run_config  # noqa: E402
from harness.model.build import TinyModelConfig, build_model, build_tokenizer  # noqa: E402
from harness.ppo.actor import PPOActor  # noqa: E402
from harness.ppo.normalization import NormConfig  # noqa: E402
from harness.sampling.local import sample  # noqa: E402
from harness.tasks import get_task  # noqa: E402

LR = 3e-4
SECTION = "PPO step: harness vs TRL GRPOTrainer vs plain loop"
# GRPO's advantage: (r - group mean) / group std.
GROUP_NORM = NormConfig(mean_level="group", std_level="group")


def reward_of(text: str) -> float:
    """Trivial, deterministic and length-independent: the fraction of digits."""
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def setup(seed: int = 0):
    """(model, tokenizer) with EOS unreachable: see the module docstring."""
    tok = build_tokenizer()
    model = build_model(tok, TinyModelConfig(), seed=seed)
    n_vocab = model.config.vocab_size
    tok.add_special_tokens({"eos_token": "<never>"})
    assert tok.eos_token_id >= n_vocab, "EOS must lie outside the model's vocabulary"
    model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok


def prompts_for(n_prompts: int, n_steps: int) -> list[list[str]]:
    task = get_task("reverse")
    rng = random.Random(0)
    return [[e.prompt for e in task.sample(rng, n_prompts)] for _ in range(n_steps)]


# ---------------------------------------------------------------- harness
def run_harness(base, tok, batches, n_samples, max_new, warmup):
    """The loop body of harness.run.loop.run (staleness 0, no reference model, no critic)."""
    model = copy.deepcopy(base)
    model.train()
    cfg = PPOActorConfig(ppo_n_minibatches=1, ppo_epochs=1, reward_norm=GROUP_NORM)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    actor = PPOActor(cfg, model, optimizer, scheduler=scheduler, grad_clip=1.0)
    gen = torch.Generator().manual_seed(0)
    times, t_samp, n_tokens = [], [], []
    for prompts in batches:
        t0 = time.perf_counter()
        rb = sample(
            model,
            tok,
            prompts,
            n_samples=n_samples,
            max_new_tokens=max_new,
            temperature=cfg.temperature,
            top_p=1.0,
            generator=gen,
        )
        assert torch.isfinite(rb.logprobs).all()
        t_rollout = time.perf_counter() - t0
        scores = [reward_of(c) for c in rb.completions]
        rewards = torch.tensor(scores, dtype=torch.float32)
        batch = {
            "input_ids": rb.input_ids,
            "attention_mask": rb.attention_mask,
            "loss_mask": rb.loss_mask,
            "logprobs": rb.logprobs,
            "rewards": rewards,
            "group_sizes": rb.group_sizes,
            "truncated": rb.truncated,
        }
        actor.compute_advantages(batch)
        stats = actor.ppo_update(batch)
        assert all(torch.isfinite(p).all() for p in model.parameters())
        m = batch["mask"]
        adv = batch["advantages"][m]
        groups = rewards.view(-1, n_samples)
        step_time = time.perf_counter() - t0
        metrics = {  # what train.run computes per step (minus eval)
            "objective/reward": float(rewards.mean()),
            "objective/reward_std": float(rewards.std()),
            "advantages/mean": float(adv.mean()),
            "advantages/std": float(adv.std()),
            "advantages/abs_max": float(adv.abs().max()),
            "rollout/response_length": float(rb.response_lens.float().mean()),
            "rollout/truncated_frac": float(rb.truncated.float().mean()),
            "rollout/zero_std_groups": float(
                (groups.max(1).values == groups.min(1).values).float().mean()
            ),
            "optim/lr": float(scheduler.get_last_lr()[0]),
            "perf/step_time": step_time,
            "perf/rollout_time": t_rollout,
            "perf/tokens_per_sec": int(rb.response_lens.sum()) / step_time,
            **stats,
        }
        assert metrics
        times.append(time.perf_counter() - t0)
        t_samp.append(t_rollout)
        n_tokens.append(int(rb.response_lens.min()))
    assert min(n_tokens) == max_new, n_tokens
    return times[warmup:], t_samp[warmup:]


def run_harness_train(n_prompts, n_samples, max_new, steps, warmup, threads):
    """The real harness.run.loop.run; median of its own perf/step_time metric."""
    from harness.run.loop import run

    cfg = build_run_config(
        overrides={
            "steps": steps,
            "threads": threads,
            "task": "reverse",
            "rollout.prompts_per_step": n_prompts,
            "rollout.n_samples": n_samples,
            "rollout.max_new_tokens": max_new,
            "ppo.ppo_n_minibatches": 1,
            "ppo.ppo_epochs": 1,
            "ppo.reward_norm": {"mean_level": "group", "std_level": "group"},
            "eval.every": 0,
            "eval.n_prompts": 1,
            "optim.lr": LR,
        }
    )
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as d:
        warnings.simplefilter("ignore")
        res = run(cfg, results_dir=d)
    assert res.status == "completed", res.reason
    h = res.history
    return h["perf/step_time"][warmup:], h["rollout/response_length"][warmup:]


# ---------------------------------------------------------------- plain
def run_plain(base, tok, batches, n_samples, max_new, warmup):
    model = copy.deepcopy(base)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    torch.manual_seed(0)
    times, t_gen = [], []
    for prompts in batches:
        t0 = time.perf_counter()
        enc = tok(prompts, padding=True, return_tensors="pt")
        ids = enc["input_ids"].repeat_interleave(n_samples, 0)
        att = enc["attention_mask"].repeat_interleave(n_samples, 0)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=att,
                do_sample=True,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                max_new_tokens=max_new,
            )
        t_gen.append(time.perf_counter() - t0)
        P = ids.shape[1]
        comp = out[:, P:]
        assert comp.shape[1] == max_new
        texts = tok.batch_decode(comp, skip_special_tokens=True)
        r = torch.tensor([reward_of(t) for t in texts]).view(-1, n_samples)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1, 1)
        full_att = torch.cat([att, torch.ones_like(comp)], 1)
        logits = model(input_ids=out, attention_mask=full_att).logits[:, P - 1 : -1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)
        loss = -(adv * logp).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times[warmup:], t_gen[warmup:]


# ---------------------------------------------------------------- TRL
def run_trl(base, tok, batches, n_samples, max_new, warmup):
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model = copy.deepcopy(base)
    marks: list[float] = []
    lens: list[int] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    def reward(completions, completion_ids=None, **kw):
        if completion_ids is not None:
            lens.extend(len(c) for c in completion_ids)
        return [reward_of(c) for c in completions]

    n_prompts = len(batches[0])
    data = Dataset.from_dict({"prompt": [p for b in batches for p in b]})
    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            report_to="none",
            num_iterations=1,
            beta=0.0,
            learning_rate=LR,
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_grad_norm=1.0,
            per_device_train_batch_size=n_prompts * n_samples,
            num_generations=n_samples,
            max_completion_length=max_new,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            logging_steps=10**6,
            save_strategy="no",
            max_steps=len(batches),
            shuffle_dataset=False,
            disable_tqdm=True,
            seed=0,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=tok,
            callbacks=[Clock()],
        )
        with contextlib.redirect_stdout(io.StringIO()):  # its end-of-training summary dict
            trainer.train()
    assert len(marks) == len(batches) + 1, len(marks)
    assert lens and min(lens) == max_new == max(lens), (min(lens), max(lens))
    times = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    return times[warmup:]


# ---------------------------------------------------------------- main
def median_ms(xs):
    return statistics.median(xs) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="only config (a), nothing recorded")
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    # As every `harness` process does (harness/core/perf.py); process-wide, so all three contenders
    # get the same allocator.
    from harness.core.perf import tune_malloc

    tune_malloc()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load0 = os.getloadavg()[0]
    t_all = time.perf_counter()

    # (prompts, samples, new tokens, warm-up steps, measured steps)
    configs = [("a", 2, 4, 16, 3, 30), ("b", 16, 8, 32, 2, 12)]
    if a.quick:
        configs = configs[:1]
    base, tok = setup()
    rows = []
    for name, n_p, n_s, T, W, M in configs:
        batches = prompts_for(n_p, W + M)
        h, h_samp = run_harness(base, tok, batches, n_s, T, W)
        p, p_gen = run_plain(base, tok, batches, n_s, T, W)
        t = run_trl(base, tok, batches, n_s, T, W)
        ht, ht_len = run_harness_train(n_p, n_s, T, W + M, W, a.threads)
        row = {
            "cfg": f"({name}) {n_p}×{n_s}, {T} tok",
            "M": M,
            "W": W,
            "harness": median_ms(h),
            "samp": median_ms(h_samp),
            "share": statistics.median(s / x for s, x in zip(h_samp, h, strict=True)),
            "train": median_ms(ht),
            "train_len": statistics.mean(ht_len),
            "trl": median_ms(t),
            "plain": median_ms(p),
            "gen": median_ms(p_gen),
        }
        rows.append(row)
        print(
            f"{row['cfg']}: harness {row['harness']:.1f} ms (sampling {row['samp']:.1f} ms, "
            f"{row['share']:.0%}) | train.run {row['train']:.1f} ms | TRL {row['trl']:.1f} ms | "
            f"plain {row['plain']:.1f} ms (generate {row['gen']:.1f} ms) | harness/TRL {row['harness'] / row['trl']:.2f} | "
            f"harness/plain {row['harness'] / row['plain']:.2f}",
            flush=True,
        )
    load1 = os.getloadavg()[0]
    wall = time.perf_counter() - t_all
    print(f"total {wall:.0f} s; 1-min load average {load0:.2f} before, {load1:.2f} after")

    table = (
        "| config | harness (ms) | of which sampling | `train.run` perf/step_time (ms) | TRL GRPOTrainer (ms) "
        "| plain loop (ms) | of which `generate` | harness / TRL (goal ≤ 0.5) | harness / plain (goal ≤ 1.25) |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in rows:
        ok_t = "✓" if r["harness"] / r["trl"] <= 0.5 else "✗"
        ok_p = "✓" if r["harness"] / r["plain"] <= 1.25 else "✗"
        table += (
            f"| {r['cfg']} | {r['harness']:.1f} | {r['samp']:.1f} ({r['share']:.0%}) | {r['train']:.1f} "
            f"| {r['trl']:.1f} | {r['plain']:.1f} | {r['gen']:.1f} ({r['gen'] / r['plain']:.0%}) | **{r['harness'] / r['trl']:.2f}** {ok_t} "
            f"| **{r['harness'] / r['plain']:.2f}** {ok_p} |\n"
        )
    steps = "; ".join(f"{r['cfg'].split()[0]} {r['W']} warm-up + {r['M']} measured" for r in rows)
    body = (
        f"Command: `.venv/bin/python benchmarks/bench_step.py{'' if a.threads == 1 else f' --threads {a.threads}'}` "
        f"(torch threads: {a.threads}; glibc malloc thresholds raised for all contenders as in "
        f"harness processes; whole script {wall:.0f} s; 1-min load average {load0:.2f} before, "
        f"{load1:.2f} after).  Median ms per step ({steps}), one process, the same tiny Llama "
        "(fresh copy each), the same `reverse` prompts, reward = fraction of digits, AdamW lr 3e-4, one "
        "optimizer step per batch, temperature 1, no top-k/top-p.  EOS is made unreachable (the "
        "tokenizer's EOS is remapped to an id outside the model's vocabulary), so every contender "
        "generates exactly the stated number of tokens per row.  harness = the loop body of "
        "`harness.run.loop.run` (`rollout.sample` → score → `PPOActor.compute_advantages` → `ppo_update`, "
        "one minibatch, group reward norm, grad clip, the loop's checks and metrics; no eval); "
        "`train.run` = the real loop's own `perf/step_time` on the real `reverse` task (EOS possible "
        "there; mean response length "
        + ", ".join(f"{r['train_len']:.1f}" for r in rows)
        + " tokens).  "
        "TRL = `GRPOTrainer` (`use_cpu`, fp32, no gradient checkpointing, `num_iterations=1`, `beta=0`, "
        "one generation batch per optimizer step, tqdm off), time between consecutive `on_step_end`s.  "
        "plain = `model.generate` → forward → REINFORCE loss → backward → AdamW (no clipping).\n\n"
        + table
    )
    if not (a.quick or a.no_record):
        record(SECTION if a.threads == 1 else f"{SECTION} ({a.threads} threads)", body)


if __name__ == "__main__":
    main()
