"""TRL's ``GRPOTrainer`` as a harness trainer: same model, task, reward, seeds, budget and metrics.

One harness step is one TRL generation cycle: ``prompts_per_step × n_samples`` completions are
sampled once, then ``ppo_n_minibatches × ppo_epochs`` optimizer steps use them
(``steps_per_generation`` × ``num_iterations``).  The prompts are the ones the harness loop would
draw (``task.sample`` with ``random.Random(seed)``, step by step), fed in order
(``shuffle_dataset=False``), and the model is the same (warm-started from the same cache).

TRL logs after every optimizer step (``logging_steps=1``); the callback gathers the logs of one
cycle and emits one metrics dict in the harness vocabulary (``TRL_METRICS`` says which TRL key
becomes which harness key and how the cycle's values are combined).  Rewards, advantages and
timings are taken where TRL computes them (``_generate_and_score_completions``), not re-derived.
"""

from __future__ import annotations

import logging
import math
import random
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.config import RunConfig
from harness.config.trl_map import approximations, grpo_kwargs
from harness.core.configtools import to_dict
from harness.metrics import check_names
from harness.metrics.stability import RUN_SMOOTH, START_WINDOW, summarize_run
from harness.metrics.trl import TRL_METRICS
from harness.model.build import eos_ids, load_model_and_tokenizer, max_positions, resolve_device
from harness.model.lora import prepare_for_training
from harness.ppo.advantages import shape_rewards
from harness.tasks import get_task


def _combine(values: list[float], how: str) -> float:
    vals = [v for v in values if v is not None]
    if not vals:
        return math.nan
    if how == "max":
        return max(vals)
    if how == "last":
        return vals[-1]
    return sum(vals) / len(vals)


def run_trl(
    cfg: RunConfig,
    *,
    on_metrics: Callable[[int, dict[str, float]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    results_dir: Path | str = "results",
) -> Any:
    """Train ``cfg`` with ``trl.GRPOTrainer``; a ``RunResult`` like ``harness.run.loop.run``'s."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from harness.run.loop import Diverged, RunResult, evaluate

    t_start = time.perf_counter()
    kwargs = grpo_kwargs(cfg)  # raises for what TRL cannot express (validated earlier too)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    device = resolve_device(cfg.device)
    task = get_task(cfg.task, **cfg.task_options)
    model, tokenizer = load_model_and_tokenizer(
        cfg.model, seed=cfg.seed, device=str(device), tiny=cfg.tiny, options=cfg.model_options
    )
    # Gradient checkpointing and LoRA exactly as the harness loop applies them, so the warm start
    # (and its cache entry) is the same; TRL then trains the (peft) model it is handed.
    model = prepare_for_training(model, cfg.model_options)
    sample_kw: dict[str, Any] = {
        "eos_token_ids": eos_ids(model, tokenizer),
        "max_positions": max_positions(model.config),
    }
    tags: dict[str, str] = {"trainer": "trl", "inert_clip": "false"}
    if cfg.warm_start.steps > 0:
        from harness.run.warmstart import cached_warm_start

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
            chat_template=None,
            # The same key parts as harness.run.loop.run: both trainers share one cache entry.
            key_parts={
                "tiny": to_dict(cfg.tiny),
                "task_options": cfg.task_options,
                "model_options": to_dict(cfg.model_options),
            },
        )
        tags["warm_start.cache_key"] = str(info.get("key", ""))
    approx = approximations(cfg)
    if approx:
        tags["trl.approximations"] = "; ".join(approx)[:500]

    from harness.run.loop import clip_is_inert

    inert = clip_is_inert(cfg)
    tags["inert_clip"] = str(inert).lower()

    # The harness loop's prompts, step by step, in order.
    rng = random.Random(cfg.seed)
    examples = [e for _ in range(cfg.steps) for e in task.sample(rng, cfg.rollout.prompts_per_step)]
    data = Dataset.from_dict(
        {"prompt": [e.prompt for e in examples], "idx": list(range(len(examples)))}
    )
    p = cfg.ppo
    per_cycle = p.ppo_n_minibatches * p.ppo_epochs
    n_samples = cfg.rollout.n_samples
    raw_rewards: list[list[float]] = []  # per generation cycle, the task's unshaped scores
    seen_idx: list[list[int]] = []  # per generation cycle, the prompt indices TRL scored

    def reward(
        prompts: list[str], completions: list[str], idx: list[int], **_: Any
    ) -> list[float | None]:
        seen_idx.append(list(idx))
        scores = [task.score(examples[i], c) for i, c in zip(idx, completions, strict=True)]
        raw_rewards.append(scores)
        shaped = shape_rewards(
            torch.tensor(scores, dtype=torch.float32),
            scaling=p.reward_scaling,
            bias=p.reward_bias,
            clip=p.reward_clip,
        )
        return shaped.tolist()

    reward.__name__ = f"task_{cfg.task.split(':')[0]}"

    gen_stats: list[dict[str, float]] = []

    class _Trainer(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                out = super()._generate_and_score_completions(inputs)
            except RuntimeError as err:
                what = _sampling_divergence(err, self.model)
                if what is None:  # out of memory, a device or library error: an error
                    raise
                raise Diverged(rs.step, what) from None
            m = out["completion_mask"].bool()
            adv = out["advantages"].unsqueeze(1).expand_as(m)[m].float()
            gen_stats.append(
                {
                    "time": time.perf_counter() - t0,
                    "tokens": float(m.sum()),
                    "advantages/mean": float(adv.mean()) if adv.numel() else 0.0,
                    "advantages/std": float(adv.std()) if adv.numel() > 1 else 0.0,
                    "advantages/abs_max": float(adv.abs().max()) if adv.numel() else 0.0,
                }
            )
            return out

    class _State:
        step = 0  # harness steps completed
        logs: list[dict[str, float]] = []
        t_cycle = 0.0
        status, reason = "completed", ""
        bad_steps = 0
        diverged_step: int | None = None

    rs = _State()
    history: dict[str, list[float]] = {}
    eval_examples = task.eval_examples(cfg.eval.n_prompts)
    # The start that final/eval_reward is compared with, as in the harness loop: the warm-started
    # policy, greedy, on the same held-out prompts, before any update.
    start_eval = evaluate(
        model,
        tokenizer,
        task,
        eval_examples,
        max_new_tokens=cfg.rollout.max_new_tokens,
        device=device,
        **sample_kw,
    )

    def record(step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            history.setdefault(k, [math.nan] * step).append(float(v))
        for seq in history.values():
            if len(seq) < step + 1:
                seq.append(math.nan)
        if on_metrics is not None:
            on_metrics(step, metrics)

    def end_of_cycle(trainer_model: torch.nn.Module) -> bool:
        """Emit one harness step; True when training must stop."""
        step = rs.step
        if not _params_finite(trainer_model):
            raise Diverged(step, "non-finite policy parameters after the update")
        # The step's time runs from the end of the previous cycle's bookkeeping (evaluation
        # excluded, as in the harness loop) to TRL's log of its last optimizer step.
        step_time = time.perf_counter() - rs.t_cycle
        metrics: dict[str, float] = {}
        for trl_key, (key, how) in TRL_METRICS.items():
            vals = [lg[trl_key] for lg in rs.logs if lg.get(trl_key) is not None]
            if vals:
                metrics[key] = _combine(vals, how)
        grads = [lg["grad_norm"] for lg in rs.logs if lg.get("grad_norm") is not None]
        # An optimizer step is non-finite when its logged loss or gradient norm is (HF logs no
        # grad_norm when clipping is off, so only what was logged counts).
        nonfinite = sum(
            1
            for lg in rs.logs
            if any(
                lg.get(k) is not None and not math.isfinite(float(lg[k]))
                for k in ("loss", "grad_norm")
            )
        )
        if grads:
            metrics["stability/grad_norm_max"] = max(grads)
        scores = raw_rewards[-1] if raw_rewards else []
        g = gen_stats[-1] if gen_stats else {}
        if scores:
            r = torch.tensor(scores, dtype=torch.float32)
            groups = r.view(-1, n_samples)
            metrics["objective/reward"] = float(r.mean())
            metrics["objective/reward_std"] = float(r.std()) if r.numel() > 1 else 0.0
            metrics["rollout/zero_std_groups"] = float(
                (groups.max(1).values == groups.min(1).values).float().mean()
            )
        metrics.update({k: v for k, v in g.items() if k.startswith("advantages/")})
        metrics["objective/kl"] = 0.0
        metrics["rollout/staleness"] = 0.0
        rs_logs_n = len(rs.logs)
        metrics["stability/optimizer_steps"] = float(rs_logs_n)
        metrics["stability/nonfinite_count"] = float(nonfinite)
        metrics["stability/skipped_updates"] = 0.0  # HF's Trainer steps even on a NaN loss
        metrics["perf/step_time"] = step_time
        metrics["perf/rollout_time"] = g.get("time", math.nan)
        metrics["perf/update_time"] = step_time - g.get("time", 0.0)
        metrics["perf/tokens_per_sec"] = g.get("tokens", 0.0) / step_time if step_time > 0 else 0.0
        rs.logs = []
        is_last = step == cfg.steps - 1
        if is_last or (cfg.eval.every and (step + 1) % cfg.eval.every == 0):
            metrics.update(
                evaluate(
                    trainer_model,
                    tokenizer,
                    task,
                    eval_examples,
                    max_new_tokens=cfg.rollout.max_new_tokens,
                    device=device,
                    **sample_kw,
                )
            )
        check_names(metrics)
        record(step, metrics)
        rs.t_cycle = time.perf_counter()
        rs.step = step + 1
        rs.bad_steps = rs.bad_steps + 1 if rs_logs_n and nonfinite == rs_logs_n else 0
        if rs.bad_steps >= cfg.diverge_after:
            raise Diverged(
                step,
                f"loss or gradient norm non-finite in every update for {rs.bad_steps} "
                "consecutive steps",
            )
        if should_stop is not None and should_stop() and rs.step < cfg.steps:
            rs.status, rs.reason = "interrupted", f"interrupted at step {rs.step}"
            return True
        return False

    class _Bridge(TrainerCallback):  # type: ignore[misc]
        """Collects TRL's per-optimizer-step logs; the last one of a cycle closes the step."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            rs.t_cycle = time.perf_counter()
            if should_stop is not None and should_stop():
                rs.status, rs.reason = "interrupted", "interrupted at step 0"
                control.should_training_stop = True

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            logs = kwargs.get("logs")
            if not logs or "train_runtime" in logs:  # the end-of-training summary
                return
            rs.logs.append(dict(logs))
            if state.global_step % per_cycle == 0 and end_of_cycle(kwargs["model"]):
                control.should_training_stop = True

    hf_logging.set_verbosity_error()
    logging.getLogger("trl").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as out_dir, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = GRPOConfig(
            output_dir=out_dir,
            use_cpu=device.type == "cpu",
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            shuffle_dataset=False,
            disable_tqdm=True,
            dataloader_num_workers=0,
            **kwargs,
        )
        trainer = _Trainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[_Bridge()],
        )
        # With tqdm off, HF prints every log dict to stdout; the harness reports through callbacks.
        trainer.remove_callback(PrinterCallback)
        try:
            trainer.train()
        except Diverged as err:
            rs.status, rs.reason = "diverged", str(err)
            rs.diverged_step = err.step
            tags["diverged_step"] = str(err.step)

    LAST_PROMPT_ORDER[:] = seen_idx
    summary = summarize_run(history, smooth=RUN_SMOOTH, diverged_step=rs.diverged_step)
    first = [v for v in history.get("objective/reward", [])[:START_WINDOW] if math.isfinite(v)]
    summary["start/reward"] = sum(first) / len(first) if first else math.nan
    summary["start/eval_reward"] = start_eval["eval/reward"]
    summary["start/eval_accuracy"] = start_eval["eval/accuracy"]
    evals = [v for v in history.get("eval/reward", []) if math.isfinite(v)]
    summary["final/eval_reward"] = evals[-1] if evals else math.nan
    return RunResult(
        status=rs.status,
        reason=rs.reason,
        steps_done=rs.step,
        history=history,
        summary=summary,
        wall_time=time.perf_counter() - t_start,
        inert_clip=inert,
        tags=tags,
    )


# For tests: the prompt indices of each generation cycle of the last run in this process.
LAST_PROMPT_ORDER: list[list[int]] = []


def _sampling_divergence(err: RuntimeError, model: torch.nn.Module | None) -> str | None:
    """Why a failure inside TRL's generation is the policy diverging (multinomial on NaN/inf
    probabilities, non-finite weights), or None when it is not (it must stay an error)."""
    from harness.run.loop import is_numeric_overflow

    if isinstance(err, torch.OutOfMemoryError):
        return None
    if model is not None and not _params_finite(model):
        return "non-finite policy parameters while sampling"
    if is_numeric_overflow(err):
        return f"non-finite probabilities while sampling ({str(err).splitlines()[0][:200]})"
    return None


def _params_finite(model: torch.nn.Module) -> bool:
    norms = torch._foreach_norm([p.detach() for p in model.parameters()])
    return bool(torch.isfinite(torch.stack(norms)).all())
