"""TRL's ``GRPOTrainer`` as a harness trainer: same model, task, reward, seeds, budget and metrics.

One harness step is one TRL generation cycle: ``prompts_per_step × n_samples`` completions are
sampled once, then ``ppo_n_minibatches × ppo_epochs`` optimizer steps use them
(``steps_per_generation`` × ``num_iterations``).  The prompts are the ones the harness loop would
draw (``task.sample`` with ``random.Random(seed)``, step by step), fed in order
(``shuffle_dataset=False``), and the model is the same: the run scaffold
(``harness/run/scaffold.py``) builds and warm-starts it, evaluates it, records each step and
writes the summary, for this trainer as for the harness loop.

TRL logs after every optimizer step (``logging_steps=1``); the callback gathers the logs of one
cycle and emits one metrics dict in the harness vocabulary (``TRL_METRICS`` says which TRL key
becomes which harness key and how the cycle's values are combined).  Rewards, advantages and
timings are taken where TRL computes them (``_generate_and_score_completions``), not re-derived.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any, Unpack

import torch
from datasets import Dataset
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback
from transformers.utils import logging as hf_logging

from harness.config import RunConfig
from harness.metrics.trl import TRL_METRICS
from harness.model.build import params_finite
from harness.model.engine_support import engine_env, quiet_engine_logs
from harness.peers.trl import approximations, grpo_kwargs
from harness.ppo.advantages import shape_rewards
from harness.ppo.shaping import overlong_penalty
from harness.run.scaffold import (
    Diverged,
    Hooks,
    Run,
    RunResult,
    execute,
    is_numeric_overflow,
)
from harness.run.trl_engine import ColocatedEngine, colocated_engine, shutdown

# TRL's "vLLM version newer than supported" warning (trl/import_utils.py, is_vllm_available).
VLLM_VERSION_WARNING = r"TRL currently supports vLLM versions"

with warnings.catch_warnings(), engine_env(quiet_engine_logs()):
    # Importing TRL imports the installed engine when there is one, and TRL 1.16 warns at each
    # of its import sites that vLLM 0.32 is newer than its tested range (0.22-0.31). The
    # colocated path the harness runs with it is tested (tests/run/test_trl_engine.py), so on
    # the console the warning is noise, for runs with or without the engine. The import is
    # often vLLM's first: its logging is set up then (errors only, as for the engine's start).
    warnings.filterwarnings("ignore", message=VLLM_VERSION_WARNING, category=UserWarning)
    from trl import GRPOConfig, GRPOTrainer


def run_trl(cfg: RunConfig, **hooks: Unpack[Hooks]) -> RunResult:
    """Train ``cfg`` with ``trl.GRPOTrainer``; a ``RunResult`` like ``harness.run.loop.run``'s."""
    kwargs = grpo_kwargs(cfg)  # raises for what TRL cannot express (validated earlier too)
    return execute(cfg, lambda run: grpo_steps(run, kwargs), hooks)


def grpo_steps(run: Run, grpo_config: dict[str, Any]) -> None:
    """``GRPOTrainer.train()`` on the scaffold's warm-started policy, one generation cycle per
    harness step; ``grpo_config`` is :func:`harness.peers.trl.grpo_kwargs` of ``run.cfg``."""
    cfg = run.cfg
    run.tags["trainer"] = "trl"
    approx = approximations(cfg)
    if approx:
        run.tags["trl.approximations"] = "; ".join(approx)[:500]

    # The harness loop's prompts, step by step, in order.
    rng = random.Random(cfg.seed)
    examples = [
        e for _ in range(cfg.steps) for e in run.task.sample(rng, cfg.rollout.prompts_per_step)
    ]
    data = Dataset.from_dict(
        {"prompt": [e.prompt for e in examples], "idx": list(range(len(examples)))}
    )
    cycles = _Cycles(run)
    reward = _reward_function(run, examples, cycles.raw_rewards)

    hf_logging.set_verbosity_error()
    logging.getLogger("trl").setLevel(logging.ERROR)
    with contextlib.ExitStack() as stack:
        out_dir = stack.enter_context(tempfile.TemporaryDirectory())
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        run.tags["sampler"] = (
            "TRL's colocated vLLM engine"
            if cfg.rollout.sampler_backend == "vllm"
            else "TRL's generate (transformers)"
        )
        if cfg.rollout.sampler_backend == "vllm":
            # TRL's own colocated engine (harness/run/trl_engine.py): the process set up for
            # it while the trainer lives, undone whatever ends the run.
            cycles.engine = stack.enter_context(colocated_engine(run))
        args = GRPOConfig(
            output_dir=out_dir,
            use_cpu=run.device.type == "cpu",
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            shuffle_dataset=False,
            disable_tqdm=True,
            dataloader_num_workers=0,
            **grpo_config,
        )
        trainer = _Trainer(
            model=run.model,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=run.tokenizer,
            callbacks=[_Bridge(cycles)],
        )
        trainer.cycles = cycles
        # With tqdm off, HF prints every log dict to stdout; the harness reports through callbacks.
        trainer.remove_callback(PrinterCallback)
        if cycles.engine is not None:
            stack.callback(shutdown, trainer.vllm_generation)
            cycles.engine.install_sync(trainer.vllm_generation)
        trainer.train()  # a Diverged raised in a callback ends it: the scaffold records it


def _reward_function(
    run: Run, examples: list[Any], raw_rewards: list[list[float]]
) -> Callable[..., list[float | None]]:
    """The reward function handed to TRL: the task's scores of ``examples[idx]`` (appended to
    ``raw_rewards``, one list per generation cycle), with AReaL's overlong penalty and the
    reward shaping of ``run.cfg``."""
    cfg, task = run.cfg, run.task
    p = cfg.ppo

    def reward(
        prompts: list[str],
        completions: list[str],
        idx: list[int],
        completion_ids: list[list[int]] | None = None,
        **_: Any,
    ) -> list[float | None]:
        run.scored(run.steps_done, [examples[i].prompt for i in idx])
        scores = [task.score(examples[i], c) for i, c in zip(idx, completions, strict=True)]
        raw_rewards.append(scores)
        total = torch.tensor(scores, dtype=torch.float32)
        if p.overlong_reward_penalty and completion_ids is not None:
            # AReaL's penalty from the token count (EOS included), before the shaping.
            assert p.overlong_tokens is not None and p.overlong_penalty_factor is not None
            lengths = torch.tensor([len(c) for c in completion_ids])
            total = total + overlong_penalty(
                lengths,
                cfg.rollout.max_new_tokens,
                p.overlong_tokens,
                p.overlong_penalty_factor,
            )
        shaped = shape_rewards(
            total,
            scaling=p.reward_scaling,
            bias=p.reward_bias,
            clip=p.reward_clip,
        )
        return shaped.tolist()

    reward.__name__ = f"task_{cfg.task.split(':')[0]}"
    return reward


class _Cycles:
    """The bookkeeping of TRL's generation cycles: each one's generation statistics, raw
    rewards and optimizer-step logs, recorded as one harness step when the cycle ends."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.per_cycle = run.cfg.ppo.ppo_n_minibatches * run.cfg.ppo.ppo_epochs
        self.raw_rewards: list[list[float]] = []  # per generation cycle, the task's raw scores
        self.gen_stats: list[dict[str, float]] = []
        self.logs: list[dict[str, float]] = []  # TRL's logs of the current generation cycle
        self.started = 0.0  # when the current cycle began (the previous one's bookkeeping excluded)
        self.engine: ColocatedEngine | None = None  # TRL's engine, with sampler_backend: vllm

    def end(self, trainer_model: torch.nn.Module) -> bool:
        """Record one harness step; True when training must stop."""
        run = self.run
        step = run.steps_done
        if not params_finite(trainer_model):
            raise Diverged(step, "non-finite policy parameters after the update")
        # The step's time runs from the end of the previous cycle's bookkeeping (evaluation
        # excluded, as in the harness loop) to TRL's log of its last optimizer step.
        step_time = time.perf_counter() - self.started
        g = self.gen_stats[-1] if self.gen_stats else {}
        scores = self.raw_rewards[-1] if self.raw_rewards else []
        metrics = _cycle_metrics(self.logs, scores, g, run.cfg.rollout.n_samples)
        metrics["perf/step_time"] = step_time
        metrics["perf/rollout_time"] = g.get("time", math.nan)
        metrics["perf/update_time"] = step_time - g.get("time", 0.0)
        metrics["perf/tokens_per_sec"] = g.get("tokens", 0.0) / step_time if step_time > 0 else 0.0
        if self.engine is not None:
            metrics["perf/weight_sync_s"] = self.engine.pop_sync_seconds()
        n_updates, n_bad = len(self.logs), metrics["stability/nonfinite_count"]
        self.logs.clear()
        if run.eval_due(step):
            metrics.update(run.evaluate(trainer_model))
        run.record(step, metrics, all_updates_nonfinite=bool(n_updates) and n_bad == n_updates)
        self.started = time.perf_counter()
        return run.steps_done < run.cfg.steps and run.stop_requested(run.steps_done)


class _Trainer(GRPOTrainer):  # type: ignore[misc]
    """TRL's trainer with each generation timed and its advantages summarised into
    ``cycles.gen_stats``; a sampling failure of a diverged policy ends the run as diverged."""

    cycles: _Cycles  # set right after construction, before training starts

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            out = super()._generate_and_score_completions(inputs)
        except RuntimeError as err:
            what = _sampling_divergence(err, self.model)
            if what is None:  # out of memory, a device or library error: an error
                raise
            raise Diverged(self.cycles.run.steps_done, what) from None
        m = out["completion_mask"].bool()
        adv = out["advantages"].unsqueeze(1).expand_as(m)[m].float()
        self.cycles.gen_stats.append(
            {
                "time": time.perf_counter() - t0,
                "tokens": float(m.sum()),
                "advantages/mean": float(adv.mean()) if adv.numel() else 0.0,
                "advantages/std": float(adv.std()) if adv.numel() > 1 else 0.0,
                "advantages/abs_max": float(adv.abs().max()) if adv.numel() else 0.0,
            }
        )
        return out


class _Bridge(TrainerCallback):  # type: ignore[misc]
    """Collects TRL's per-optimizer-step logs; the last one of a cycle closes the step."""

    def __init__(self, cycles: _Cycles) -> None:
        self.cycles = cycles

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.cycles.started = time.perf_counter()
        if self.cycles.run.stop_requested(0):
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        logs = kwargs.get("logs")
        if not logs or "train_runtime" in logs:  # the end-of-training summary
            return
        self.cycles.logs.append(dict(logs))
        if state.global_step % self.cycles.per_cycle == 0 and self.cycles.end(kwargs["model"]):
            control.should_training_stop = True


def _cycle_metrics(
    logs: list[dict[str, float]], scores: list[float], gen: dict[str, float], n_samples: int
) -> dict[str, float]:
    """One generation cycle's metrics in the harness vocabulary: TRL's per-optimizer-step
    ``logs`` combined as ``TRL_METRICS`` says, the task's raw ``scores`` and the generation's
    advantage statistics ``gen``."""
    metrics: dict[str, float] = {}
    for trl_key, (key, how) in TRL_METRICS.items():
        vals = [lg[trl_key] for lg in logs if lg.get(trl_key) is not None]
        if vals:
            metrics[key] = _combine(vals, how)
    grads = [lg["grad_norm"] for lg in logs if lg.get("grad_norm") is not None]
    # An optimizer step is non-finite when its logged loss or gradient norm is (HF logs no
    # grad_norm when clipping is off, so only what was logged counts).
    nonfinite = sum(
        1
        for lg in logs
        if any(
            lg.get(k) is not None and not math.isfinite(float(lg[k])) for k in ("loss", "grad_norm")
        )
    )
    if grads:
        metrics["stability/grad_norm_max"] = max(grads)
    if scores:
        r = torch.tensor(scores, dtype=torch.float32)
        groups = r.view(-1, n_samples)
        metrics["objective/reward"] = float(r.mean())
        metrics["objective/reward_std"] = float(r.std()) if r.numel() > 1 else 0.0
        metrics["rollout/zero_std_groups"] = float(
            (groups.max(1).values == groups.min(1).values).float().mean()
        )
    metrics.update({k: v for k, v in gen.items() if k.startswith("advantages/")})
    metrics["objective/kl"] = 0.0
    metrics["rollout/staleness"] = 0.0
    metrics["stability/optimizer_steps"] = float(len(logs))
    metrics["stability/nonfinite_count"] = float(nonfinite)
    metrics["stability/skipped_updates"] = 0.0  # HF's Trainer steps even on a NaN loss
    return metrics


def _combine(values: list[float], how: str) -> float:
    vals = [v for v in values if v is not None]
    if not vals:
        return math.nan
    if how == "max":
        return max(vals)
    if how == "min":
        return min(vals)
    if how == "last":
        return vals[-1]
    return sum(vals) / len(vals)


def _sampling_divergence(err: RuntimeError, model: torch.nn.Module | None) -> str | None:
    """Why a failure inside TRL's generation is the policy diverging (multinomial on NaN/inf
    probabilities, non-finite weights), or None when it is not (it must stay an error)."""
    if isinstance(err, torch.OutOfMemoryError):
        return None
    if model is not None and not params_finite(model):
        return "non-finite policy parameters while sampling"
    if is_numeric_overflow(err):
        return f"non-finite probabilities while sampling ({str(err).splitlines()[0][:200]})"
    return None
