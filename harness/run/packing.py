"""Several PPO runs on one base model: a pack.

An ablation's cells usually share the model, the task and the rollout shape and differ only in
PPO settings (clip, normalization, corrections, learning rate). Under LoRA the base model is
frozen, so K such runs can share one copy of it: :func:`run_packed` loads the base once, gives
each run (a *trial* of the pack) its own adapter on the one ``peft`` model, and steps the trials
in turn, one PPO step each (the loop's steps are a generator, ``harness/run/loop.py``).

What is shared and what is each trial's own:

=======================  =====================================================================
shared (once)            the base weights, the tokenizer, the device and threads
each trial's own         its adapter (warm-started from the warm-start cache as its unpacked
                         run would be), optimizer and LR schedule, sampler, staleness ring,
                         RNG streams (the global torch/python/NumPy states are switched with
                         the adapter), task and reward process, hooks, history and result
=======================  =====================================================================

The KL reference under LoRA is the base with the adapters disabled, the same for every trial.
So each trial computes what its unpacked run computes (``harness.run.loop.run``): the same
metric history (tests/run/test_packing.py).

With ``rollout.sampler_backend: vllm`` the pack starts one engine, not K: it holds the base
weights and serves each trial's adapter itself (``harness/sampling/vllm_adapters.py``). Each
trial samples through its own view of it, under its own adapter (a new adapter version after
each of its updates, the previous one removed, so the engine holds at most K); the pack ends the
engine once, however its trials end. Unpacked, the engine serves a LoRA run merged into the
base weights; served as an adapter the same policy's log-probs differ by float32 rounding
(``x·W + s·(x·A)·B`` against ``x·(W + s·B·A)``), so a packed engine trial has its unpacked
engine run's history to that rounding, not exactly (tests/run/test_packing_engine.py).

Which configs can share a base is declared once, in :data:`BASE_FIELDS` (docs/scaling.md lists
them): runs pack together when every base field is equal (:func:`pack_key`,
:func:`incompatible_field`). A trial that diverges or raises ends alone, with its status
(``diverged``, ``failed``); the others go on. A stop request (a trial's ``should_stop``) or a
``KeyboardInterrupt`` (Ctrl-C, or the ``Terminated`` that SIGTERM raises under
``harness.run.tracked.signals_interrupt``) ends every trial of the pack as interrupted, each with
the reason its unpacked run would have recorded, and the results are returned.

Not packable yet: full fine-tuning (nothing to share: every run trains the whole model),
``trainer: trl`` and ``rollout.async`` (its sampler keeps its own copy of the policy). The
critic packs, but each trial's value model copies the trunk.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.config import RunConfig
from harness.config.schema import clip_is_inert
from harness.core.configtools import flatten, to_dict
from harness.core.failures import WarmStartDiverged
from harness.model.lora import (
    DEFAULT_ADAPTER,
    add_adapter,
    delete_adapter,
    load_weights,
    trainable_state,
    use_adapter,
)
from harness.run.loop import ppo_stepper
from harness.run.sampler import pack_engine
from harness.run.scaffold import (
    Base,
    Diverged,
    Hooks,
    Run,
    RunResult,
    failure_reason,
    load_base,
    open_run,
)
from harness.run.tracked import interrupt_reason
from harness.sampling import Sampler
from harness.sampling.vllm import ENGINE_LORA_RANKS
from harness.sampling.vllm_adapters import AdapterEngine, AdapterSampler

_logger = logging.getLogger(__name__)

# The fields every run of a pack shares: what the one base model, its sampler and the process
# are built from. A dotted name covers everything under it (``model_options``: dtype, LoRA rank,
# alpha, dropout and targets, checkpointing, attention kernel, trust_remote_code).
BASE_FIELDS: tuple[str, ...] = (
    "model",
    "tiny",
    "model_options",
    "task",
    "task_options",
    "seed",
    "rollout.prompts_per_step",
    "rollout.n_samples",
    "rollout.max_new_tokens",
    "rollout.max_prompt_tokens",
    "rollout.chat_template",
    "rollout.sampler_backend",
    "rollout.sampler_dtype",
    # The one engine's settings (it is started once for the pack).
    "rollout.engine_kv_cache_gib",
    "rollout.engine_gpu_memory_utilization",
    "device",
    "threads",
    "trainer",
)


def _base_leaves(cfg: RunConfig) -> dict[str, Any]:
    """The base fields' leaves of ``cfg``, dotted name → value (a dict field's keys included)."""
    flat = flatten(to_dict(cfg))
    return {
        k: v for k, v in flat.items() if any(k == f or k.startswith(f + ".") for f in BASE_FIELDS)
    }


def pack_key(cfg: RunConfig) -> tuple[tuple[str, str], ...]:
    """What a pack shares, as a hashable key: runs with equal keys can share one base model."""
    leaves = _base_leaves(cfg)
    return tuple((k, json.dumps(leaves[k], sort_keys=True, default=str)) for k in sorted(leaves))


_MISSING = object()


def incompatible_field(a: RunConfig, b: RunConfig) -> str | None:
    """The first base field (in :data:`BASE_FIELDS` order, the leaf that differs) in which ``a``
    and ``b`` differ; None when they can share a base."""
    la, lb = _base_leaves(a), _base_leaves(b)
    for f in BASE_FIELDS:
        keys = sorted(k for k in {*la, *lb} if k == f or k.startswith(f + "."))
        diffs = [k for k in keys if la.get(k, _MISSING) != lb.get(k, _MISSING)]
        # An empty block ({} or null) on one side and its keys on the other: name the key.
        deepest = [k for k in diffs if not any(d.startswith(k + ".") for d in diffs)]
        if deepest:
            return deepest[0]
    return None


def check_packable(cfgs: Sequence[RunConfig]) -> None:
    """Raise ``ValueError`` (one line naming the field) unless ``cfgs`` can run as one pack."""
    if not cfgs:
        raise ValueError("packing: no run configs to pack")
    for i, cfg in enumerate(cfgs):
        if cfg.model_options.lora is None:
            raise ValueError(
                "model_options.lora: packing needs LoRA adapters (the packed runs share one "
                "frozen base model and each trains its own adapter); set model_options.lora, "
                "or run the cells unpacked"
            )
        if cfg.trainer != "harness":
            raise ValueError(
                f"trainer: packing steps the harness's PPO loop; trainer {cfg.trainer} runs "
                "unpacked"
            )
        if cfg.rollout.asynchronous.enabled:
            raise ValueError(
                "rollout.async: not packable yet (the asynchronous sampler keeps its own copy "
                "of the policy per run); run asynchronous cells unpacked"
            )
        if (
            cfg.rollout.sampler_backend == "vllm"
            and cfg.model_options.lora.r > ENGINE_LORA_RANKS[-1]
        ):
            raise ValueError(
                f"model_options.lora.r: a pack's engine serves adapters of rank <= "
                f"{ENGINE_LORA_RANKS[-1]}, not {cfg.model_options.lora.r}; run these cells "
                "unpacked (the engine then serves each run's adapter merged)"
            )
        differs = incompatible_field(cfgs[0], cfg)
        if differs is not None:
            raise ValueError(
                f"{differs}: run {i} of the pack differs from run 0 in it, and the packed runs "
                "share it (one base model, task and rollout shape)"
            )


@dataclass
class RngStreams:
    """The process-global random states a run draws from (torch CPU and CUDA, ``random``,
    NumPy's legacy generator): each trial keeps its own, switched in for its turns, so the
    interleaving leaves every trial's draws as its unpacked run's."""

    torch_cpu: torch.Tensor
    torch_cuda: list[torch.Tensor] | None
    python: Any
    numpy: Any

    @classmethod
    def capture(cls) -> RngStreams:
        numpy = sys.modules.get("numpy")
        return cls(
            torch_cpu=torch.random.get_rng_state(),
            torch_cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
            python=random.getstate(),
            numpy=numpy.random.get_state() if numpy is not None else None,
        )

    def restore(self) -> None:
        torch.random.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)
        random.setstate(self.python)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy is not None:
            numpy.random.set_state(self.numpy)


@dataclass
class _Trial:
    """One run of the pack: its config and hooks, its adapter's name, and what it has become."""

    index: int
    cfg: RunConfig
    hooks: Hooks
    adapter: str
    run: Run | None = None
    rng: RngStreams | None = None
    steps: Generator[int, None, None] | None = None
    sampler: Sampler | None = None  # its view of the pack's engine (None: its own sampler)
    seconds: float = 0.0  # its own setup and turns (the shared setup is added at the end)
    result: RunResult | None = None
    warm: dict[str, torch.Tensor] = field(default_factory=dict)  # its adapter after warm start

    @property
    def live(self) -> bool:
        return self.run is not None and self.result is None


def run_packed(cfgs: Sequence[RunConfig], hooks_per_trial: Sequence[Hooks]) -> list[RunResult]:
    """Train ``cfgs`` (LoRA runs that share their :data:`BASE_FIELDS`) on one base model, one PPO
    step of each in turn; one result per config, in order. ``hooks_per_trial[i]`` are run
    ``i``'s hooks, as :func:`harness.run.loop.run` takes them. Raises ``ValueError`` (one line)
    for configs that cannot share a base; see the module docstring for how trials end."""
    check_packable(cfgs)
    if len(hooks_per_trial) != len(cfgs):
        raise ValueError(
            f"packing: {len(cfgs)} run configs but {len(hooks_per_trial)} sets of hooks"
        )
    t_start = time.perf_counter()
    base = load_base(cfgs[0])
    trials = [
        _Trial(i, cfg, hooks, adapter=f"trial{i}")
        for i, (cfg, hooks) in enumerate(zip(cfgs, hooks_per_trial, strict=True))
    ]
    engine = _engine_views(trials, base)
    try:
        _open_trials(trials, base)
        shared = time.perf_counter() - t_start - sum(t.seconds for t in trials)
        for t in trials:
            t.seconds += shared / len(trials)
        _step_in_turn(trials, base.model)
    except KeyboardInterrupt as err:
        reason = interrupt_reason(err)
        for t in trials:
            if t.result is None:
                _end(t, base.model, interrupted=reason)
    finally:
        try:
            for t in trials:
                if t.result is None:  # an error of the pack itself: still end each trial
                    _end(t, base.model, interrupted="interrupted: the pack ended")
        finally:
            if engine is not None:
                engine.close()
    return [t.result for t in trials if t.result is not None]


def _engine_views(trials: list[_Trial], base: Base) -> AdapterEngine | None:
    """Under ``rollout.sampler_backend: vllm``: the pack's one engine (started at the first
    load of any trial) and each trial's view of it, serving its adapter; None otherwise."""
    cfg = trials[0].cfg
    if cfg.rollout.sampler_backend != "vllm":
        return None
    # vLLM reseeds the process's random generators when it starts (from the engine seed, a base
    # field), so an unpacked run's streams after its first rollout load are the reseeded ones.
    # The trial whose load starts the engine gets that itself; every other trial is given the
    # state the start left at its own first load, as its unpacked run's start would have.
    after_start: list[RngStreams] = []
    engine = pack_engine(
        cfg,
        base.device,
        base.sample_kw,
        len(trials),
        on_start=lambda: after_start.append(RngStreams.capture()),
        on_join=lambda: after_start[-1].restore(),
    )
    for t in trials:
        t.sampler = AdapterSampler(engine, t.adapter, base.device, base.sample_kw)
    return engine


def _open_trials(trials: list[_Trial], base: Base) -> None:
    """Each trial's task, warm start and start eval, on the base's one adapter as its unpacked
    run would have them (so the warm-start cache keys and entries are the unpacked runs'), then
    each trial's own adapter holding its warm-started weights; the first adapter goes."""
    model = base.model
    fresh = trainable_state(model)  # the adapter as LoRA initialised it, every trial's start
    start = RngStreams.capture()
    for t in trials:
        t0 = time.perf_counter()
        start.restore()
        load_weights(model, fresh)
        try:
            t.run = open_run(t.cfg, t.hooks, base)
        except Exception as err:  # this trial cannot start; the others can
            # A diverged warm start is said in full by its reason: no traceback for it.
            known = isinstance(err, WarmStartDiverged)
            _logger.warning("packed run %d failed to start", t.index, exc_info=not known)
            t.result = _bare_result(t.cfg, "failed", failure_reason(err), 0.0)
        else:
            t.warm = trainable_state(model)
            t.rng = RngStreams.capture()
        t.seconds += time.perf_counter() - t0
    for t in trials:
        if t.live:
            add_adapter(model, t.adapter, t.warm, like=DEFAULT_ADAPTER)
            t.warm = {}
    if any(t.live for t in trials):
        use_adapter(model, next(t.adapter for t in trials if t.live))
        delete_adapter(model, DEFAULT_ADAPTER)


def _step_in_turn(trials: list[_Trial], model: Any) -> None:
    """One step of each live trial in turn until none is left; a stop request of any trial
    interrupts all."""
    while any(t.live for t in trials):
        for t in trials:
            if not t.live:
                continue
            _turn(t, model)
            run = t.run
            assert run is not None
            if run.status == "interrupted":  # its caller asked to stop: the whole pack stops
                for other in trials:
                    if other.live:
                        assert other.run is not None
                        _end(
                            other, model, interrupted=f"interrupted at step {other.run.steps_done}"
                        )
                return


def _turn(t: _Trial, model: Any) -> None:
    """Trial ``t``'s next step, with its adapter active and its RNG streams in; it ends here
    when its steps are done, it diverged or it raised."""
    assert t.run is not None and t.rng is not None
    use_adapter(model, t.adapter)
    t.rng.restore()
    t0 = time.perf_counter()
    ended = False
    try:
        if t.steps is None:
            t.steps = ppo_stepper(t.run, t.sampler)
        next(t.steps)
    except StopIteration:
        ended = True
    except Diverged as err:
        t.run.diverged(err)
        ended = True
    except Exception as err:  # this trial's error; the others go on
        _logger.warning("packed run %d failed", t.index, exc_info=True)
        t.run.failed(err)
        ended = True
    finally:
        t.seconds += time.perf_counter() - t0
        t.rng = RngStreams.capture()
    if ended:
        _end(t, model)


def _end(t: _Trial, model: Any, *, interrupted: str | None = None) -> None:
    """End trial ``t``: close its steps (sampler, rollouts) and its task, free its adapter while
    another remains, and keep its result."""
    if t.run is None:
        t.result = t.result or _bare_result(t.cfg, "interrupted", interrupted or "", t.seconds)
        return
    run = t.run
    if interrupted is not None and run.status == "completed":
        run.interrupt(interrupted)
    t0 = time.perf_counter()
    try:
        if t.steps is not None:
            t.steps.close()
    finally:
        run.close()
        _free_adapter(model, t.adapter)
        t.seconds += time.perf_counter() - t0
        t.result = run.result(t.seconds)


def _free_adapter(model: Any, name: str) -> None:
    """Delete adapter ``name`` while another remains (peft keeps at least one), making another
    one active first if it was (the next turn activates its own anyway)."""
    others = [a for a in model.peft_config if a != name]
    if not others or name not in model.peft_config:
        return
    if model.active_adapter == name:
        use_adapter(model, others[0])
    delete_adapter(model, name)


def _bare_result(cfg: RunConfig, status: str, reason: str, seconds: float) -> RunResult:
    """The result of a trial that never started (its setup failed, or the pack was stopped)."""
    return RunResult(
        status=status,
        reason=reason,
        steps_done=0,
        history={},
        summary={},
        wall_time=seconds,
        inert_clip=clip_is_inert(cfg),
    )


__all__ = [
    "BASE_FIELDS",
    "RngStreams",
    "check_packable",
    "incompatible_field",
    "pack_key",
    "run_packed",
]
