"""The run scaffold: what every trainer shares, around the one part that differs.

    setup    seeds, device, task, model (checkpointing, LoRA), the cached warm start, the
             held-out prompts and the start eval                                  (open_run)
    steps    the trainer's own: the harness PPO loop (harness/run/loop.py) or TRL's
             GRPOTrainer (harness/run/trl_trainer.py); before each step it asks
             ``run.stop_requested(step)``, after it calls ``run.record(step, metrics, ...)``,
             and it raises :class:`Diverged` when the numbers stop being finite
    finish   the outcome (completed, diverged with its reason, interrupted), the summary
             (``summarize_run`` plus the start and final evals) and the :class:`RunResult`

A trainer is a function ``steps(run)`` handed to :func:`execute`; so both trainers warm-start,
record, diverge, stop and summarise in one way, and the trainer contract
(tests/run/test_trainer_contract.py) holds for both.

Setup comes in two parts, so that several runs can share one base model
(``harness/run/packing.py``): :func:`load_base` (seeds, device, the model with checkpointing and
LoRA, the sampling options) and :func:`open_run` (task, warm start, start eval) on that base.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import torch

from harness.config import RunConfig
from harness.config.schema import clip_is_inert
from harness.core.configtools import to_dict
from harness.core.provenance import machine_tags
from harness.metrics import check_names
from harness.metrics.passk import mean_pass_at_k
from harness.metrics.stability import RUN_SMOOTH, START_WINDOW, summarize_run
from harness.model.build import (
    eos_ids,
    load_model_and_tokenizer,
    max_positions,
    resolve_device,
)
from harness.model.lora import prepare_for_training
from harness.model.prompting import resolve_chat_template
from harness.run.warmstart import cached_warm_start
from harness.sampling import RolloutBatch, Sampler, SamplingParams
from harness.sampling.local import sample
from harness.tasks import Example, Task, get_task


class Diverged(RuntimeError):
    """The run's numbers stopped being finite; the message is 'diverged at step N: <what>'."""

    def __init__(self, step: int, what: str) -> None:
        super().__init__(f"diverged at step {step}: {what}")
        self.step = step


# A number that stopped being finite, in a torch error message ("value cannot be converted to
# type float without overflow"), as whole words: "inference", "information" are not "inf".
_NONFINITE_WORDS = re.compile(r"\b(overflow|nan|inf)\b", re.IGNORECASE)


def is_numeric_overflow(err: BaseException) -> bool:
    """True for a torch error that reports a non-finite number; an out-of-memory never is."""
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return False
    lines = str(err).splitlines()
    return bool(lines and _NONFINITE_WORDS.search(lines[0]))


@dataclass
class RunResult:
    # "completed" | "diverged" | "interrupted"; "failed" only for a trial of a pack, which ends
    # alone when it raises (an unpacked run's error propagates instead)
    status: str
    reason: str
    steps_done: int
    history: dict[str, list[float]]
    summary: dict[str, float]
    wall_time: float
    inert_clip: bool
    tags: dict[str, str] = field(default_factory=dict)


class Hooks(TypedDict, total=False):
    """What a caller may hand a trainer; every key is optional."""

    on_metrics: Callable[[int, dict[str, float]], None] | None  # each step's metrics, once
    should_stop: Callable[[], bool] | None  # asked before each step; True interrupts the run
    on_prompts: Callable[[int, list[str]], None] | None  # each step's prompts, one per completion
    results_dir: Path | str  # the warm-start cache lives under it (default "results")


def evaluate(
    model,
    tokenizer,
    task,
    examples,
    *,
    max_new_tokens: int,
    device,
    threshold: float = 1.0,
    samples: int = 0,
    k: int = 1,
    temperature: float = 1.0,
    sampler: Sampler | None = None,
    version: int = 0,
    **sample_kw: Any,
) -> dict[str, float]:
    """Held-out evaluation: greedy completions (mean reward; accuracy = share with reward ≥
    ``threshold``) and, with ``samples`` = n > 0, n completions per prompt at ``temperature``
    (pass@1, pass@k, mean@n; harness.metrics.passk).  ``sample_kw`` (EOS ids, prompt
    truncation, position limit) go to :func:`sample`; with a ``sampler`` (the run's, open)
    ``model`` is loaded into it as ``version`` and it samples instead."""

    def draw(n: int, gen: torch.Generator, **kw: Any) -> RolloutBatch:
        if sampler is None:
            return sample(
                model, tokenizer, prompts, n_samples=n, max_new_tokens=max_new_tokens,
                generator=gen, **kw, **sample_kw,
            )  # fmt: skip
        params = SamplingParams(n_samples=n, max_new_tokens=max_new_tokens, **kw)
        return sampler.generate(tokenizer, prompts, params, gen)

    gen = torch.Generator(device=device).manual_seed(0)
    was_training = model.training
    model.eval()
    prompts = [e.prompt for e in examples]
    if sampler is not None:
        sampler.load(model, version)
    batch = draw(1, gen, greedy=True)
    scores = [task.score(e, c) for e, c in zip(examples, batch.completions, strict=True)]
    out = {
        "eval/reward": sum(scores) / len(scores),
        "eval/accuracy": sum(s >= threshold for s in scores) / len(scores),
    }
    if samples:
        drawn = draw(
            samples, torch.Generator(device=device).manual_seed(1), temperature=temperature
        )
        per_row = [e for e in examples for _ in range(samples)]
        rewards = [task.score(e, c) for e, c in zip(per_row, drawn.completions, strict=True)]
        correct = [
            sum(r >= threshold for r in rewards[i * samples : (i + 1) * samples])
            for i in range(len(examples))
        ]
        out["eval/pass_at_1"] = mean_pass_at_k(correct, samples, 1)
        out["eval/pass_at_k"] = mean_pass_at_k(correct, samples, k)
        out["eval/mean_at_n"] = sum(rewards) / len(rewards)
    model.train(was_training)
    return out


@dataclass
class Run:
    """One run as a trainer sees it: what setup built, and the bookkeeping every step ends in."""

    cfg: RunConfig
    hooks: Hooks
    device: torch.device
    task: Task
    model: Any  # the (warm-started, possibly LoRA-wrapped) policy
    tokenizer: Any
    sample_kw: dict[str, Any]  # EOS ids, prompt truncation, position limit, chat template
    eval_examples: list[Example]
    start_eval: dict[str, float]
    tags: dict[str, str]
    history: dict[str, list[float]] = field(default_factory=dict)
    steps_done: int = 0
    status: str = "completed"
    reason: str = ""
    bad_steps: int = 0  # consecutive steps whose every update was non-finite
    diverged_step: int | None = None

    def evaluate(
        self,
        model: torch.nn.Module | None = None,
        *,
        sampler: Sampler | None = None,
        version: int = 0,
    ) -> dict[str, float]:
        """The greedy eval on the held-out prompts (of ``model``, default the policy; through
        ``sampler`` loaded at ``version`` when given, else the local decoder)."""
        return evaluate(
            self.model if model is None else model,
            self.tokenizer,
            self.task,
            self.eval_examples,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            device=self.device,
            threshold=self.cfg.eval.threshold,
            samples=self.cfg.eval.samples,
            k=self.cfg.eval.k,
            temperature=self.cfg.ppo.temperature,
            sampler=sampler,
            version=version,
            **self.sample_kw,
        )

    def eval_due(self, step: int) -> bool:
        every = self.cfg.eval.every
        return step == self.cfg.steps - 1 or bool(every and (step + 1) % every == 0)

    def stop_requested(self, step: int) -> bool:
        """Asked before step ``step``: True (and the run interrupted) when the caller says stop."""
        stop = self.hooks.get("should_stop")
        if stop is None or not stop():
            return False
        self.interrupt(f"interrupted at step {step}")
        return True

    def interrupt(self, reason: str) -> None:
        """End the run as interrupted (a stop request, a signal), with ``reason``."""
        self.status, self.reason = "interrupted", reason

    def failed(self, err: BaseException) -> None:
        """End the run as failed with ``err`` (a trial of a pack: the others go on)."""
        self.status, self.reason = "failed", failure_reason(err)

    def close(self) -> None:
        """End what the run's task holds (a python: reward's process ends with the run)."""
        _close_task(self.task)

    def scored(self, step: int, prompts: list[str]) -> None:
        """The prompts step ``step`` scored, one per completion, for an ``on_prompts`` caller."""
        on_prompts = self.hooks.get("on_prompts")
        if on_prompts is not None:
            on_prompts(step, prompts)

    def record(self, step: int, metrics: dict[str, float], *, all_updates_nonfinite: bool) -> None:
        """Keep step ``step``'s metrics, hand them to ``on_metrics``, and diverge after
        ``cfg.diverge_after`` consecutive steps in which no update was finite."""
        check_names(metrics)
        for k, v in metrics.items():
            self.history.setdefault(k, [math.nan] * step).append(float(v))
        for seq in self.history.values():  # keys not logged this step get NaN
            if len(seq) < step + 1:
                seq.append(math.nan)
        on_metrics = self.hooks.get("on_metrics")
        if on_metrics is not None:
            on_metrics(step, metrics)
        self.steps_done = step + 1
        self.bad_steps = self.bad_steps + 1 if all_updates_nonfinite else 0
        if self.bad_steps >= self.cfg.diverge_after:
            raise Diverged(
                step,
                f"loss or gradient norm non-finite in every update for {self.bad_steps} "
                "consecutive steps",
            )

    def diverged(self, err: Diverged) -> None:
        self.status, self.reason = "diverged", str(err)
        self.diverged_step = err.step
        self.tags["diverged_step"] = str(err.step)

    def result(self, wall_time: float) -> RunResult:
        """The outcome and the summary of what was recorded (a partial run's too)."""
        history = self.history
        # drawdown/collapse on a moving average: one noisy batch is no collapse
        summary = summarize_run(history, smooth=RUN_SMOOTH, diverged_step=self.diverged_step)
        first = [v for v in history.get("objective/reward", [])[:START_WINDOW] if math.isfinite(v)]
        summary["start/reward"] = sum(first) / len(first) if first else math.nan
        summary["start/eval_reward"] = self.start_eval["eval/reward"]
        summary["start/eval_accuracy"] = self.start_eval["eval/accuracy"]
        # pass@k before training is where the sampled eval starts (NaN without eval.samples).
        summary["start/eval_pass_at_1"] = self.start_eval.get("eval/pass_at_1", math.nan)
        summary["start/eval_pass_at_k"] = self.start_eval.get("eval/pass_at_k", math.nan)
        evals = [v for v in history.get("eval/reward", []) if math.isfinite(v)]
        summary["final/eval_reward"] = evals[-1] if evals else math.nan
        return RunResult(
            status=self.status,
            reason=self.reason,
            steps_done=self.steps_done,
            history=history,
            summary=summary,
            wall_time=wall_time,
            inert_clip=clip_is_inert(self.cfg),
            tags=self.tags,
        )


@dataclass
class Base:
    """What setup builds before the task: the (LoRA-wrapped) model, its tokenizer, the device and
    the sampling options (EOS ids, prompt truncation, position limit, chat template)."""

    device: torch.device
    model: Any
    tokenizer: Any
    sample_kw: dict[str, Any]


def load_base(cfg: RunConfig) -> Base:
    """Threads and seeds, the device, and the model with gradient checkpointing and LoRA."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    device = resolve_device(cfg.device)
    model, tokenizer = load_model_and_tokenizer(
        cfg.model, seed=cfg.seed, device=str(device), tiny=cfg.tiny, options=cfg.model_options
    )
    # Gradient checkpointing and LoRA before the warm start, so that every trainer warm-starts
    # (and caches) the same model and then trains that one.
    model = prepare_for_training(model, cfg.model_options)
    sample_kw: dict[str, Any] = {
        "eos_token_ids": eos_ids(model, tokenizer),
        "max_prompt_tokens": cfg.rollout.max_prompt_tokens,
        "max_positions": max_positions(model.config),
        "chat_template": resolve_chat_template(cfg.rollout.chat_template, tokenizer),
    }
    return Base(device=device, model=model, tokenizer=tokenizer, sample_kw=sample_kw)


def open_run(cfg: RunConfig, hooks: Hooks, base: Base | None = None) -> Run:
    """The task and the warm-started model (on ``base``, else loaded here), then the start eval:
    the warm-started policy, greedy, on the held-out prompts every later eval uses, before any
    update (the start ``final/eval_reward`` is compared with; its own generator leaves the
    training RNGs alone)."""
    if base is None:
        base = load_base(cfg)
    task = get_task(cfg.task, **cfg.task_options)
    try:
        return _open(cfg, hooks, base, task)
    except BaseException:  # the reward process must not outlive a run that never started
        _close_task(task)
        raise


def _close_task(task: Task) -> None:
    close = getattr(task, "close", None)
    if callable(close):
        close()


def _open(cfg: RunConfig, hooks: Hooks, base: Base, task: Task) -> Run:
    model = base.model
    tags = {
        "inert_clip": str(clip_is_inert(cfg)).lower(),
        # What the numbers depend on beyond the config: the CPU's kernels and the threads.
        **machine_tags(),
        "machine.torch_threads": str(torch.get_num_threads()),
        "machine.device": str(base.device),
    }
    if cfg.warm_start.steps > 0:
        model, key = warm_start(
            cfg,
            model,
            base.tokenizer,
            task,
            results_dir=hooks.get("results_dir", "results"),
            chat_template=base.sample_kw["chat_template"],
        )
        tags["warm_start.cache_key"] = key
    run = Run(
        cfg=cfg,
        hooks=hooks,
        device=base.device,
        task=task,
        model=model,
        tokenizer=base.tokenizer,
        sample_kw=base.sample_kw,
        eval_examples=task.eval_examples(cfg.eval.n_prompts),
        start_eval={},
        tags=tags,
    )
    run.start_eval = run.evaluate()
    return run


def warm_start(
    cfg: RunConfig,
    model: Any,
    tokenizer: Any,
    task: Task,
    *,
    results_dir: Path | str,
    chat_template: str | None,
) -> tuple[Any, str]:
    """``cfg``'s supervised warm start of ``model``, trained once and then loaded from the cache
    under ``results_dir``; the model and its cache key.  Every trainer calls this, with the same
    key parts, so a cell's trainers share one entry.

    The global torch RNG leaves as it came: training draws from it (LoRA dropout) and loading
    does not, so a run's later draws would otherwise depend on whether the cache had the entry.
    """
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model, info = cached_warm_start(
            model,
            tokenizer,
            task,
            model_spec=cfg.model,
            task_spec=cfg.task,
            steps=cfg.warm_start.steps,
            batch_size=cfg.warm_start.batch_size,
            lr=cfg.warm_start.lr,
            seed=cfg.seed,
            cache_dir=Path(results_dir) / "warmstart",
            chat_template=chat_template,
            key_parts={
                "tiny": to_dict(cfg.tiny),
                "task_options": cfg.task_options,
                # LoRA rank/targets, checkpointing and precision change what training produces.
                "model_options": to_dict(cfg.model_options),
            },
        )
    return model, str(info.get("key", ""))


def execute(cfg: RunConfig, steps: Callable[[Run], None], hooks: Hooks) -> RunResult:
    """Set up, run the trainer's ``steps``, and finish; a divergence is a result, never raised."""
    t_start = time.perf_counter()
    run = open_run(cfg, hooks)
    try:
        steps(run)
    except Diverged as err:
        run.diverged(err)
    finally:
        run.close()
    return run.result(time.perf_counter() - t_start)


def failure_reason(err: BaseException) -> str:
    """The reason recorded for a run that raised ``err`` (as a tracked run records it)."""
    return f"{type(err).__name__}: {err}"[:500]
