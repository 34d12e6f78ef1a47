"""``rollout.asynchronous`` (``rollout.async``) and ``rollout.staleness`` in each target's names.

What each peer calls the harness's settings (docs/async.md has the table):

* η (``max_staleness``): AReaL ``rollout.max_head_offpolicyness`` (``InferenceEngineConfig``,
  inclusionAI/AReaL ``areal/api/cli_args.py`` @ 0073c330da43), whose capacity rule the harness's
  admission is; prime-rl ``max_async_level`` (PrimeIntellect-ai/prime-rl
  ``src/prime_rl/configs/orchestrator.py`` @ 0083212fadd5, ``OrchestratorConfig``; the ``rl``
  entry point's shared key, ``src/prime_rl/configs/rl.py`` @ 539089285f96); TRL
  ``AsyncGRPOConfig.max_staleness`` (``trl/experimental/async_grpo/async_grpo_config.py``,
  TRL 1.16); verl ``async_training.staleness_threshold`` (volcengine/verl
  ``recipe/fully_async_policy/config/fully_async_ppo_trainer.yaml`` @ 0d1d3e185fc2; its README
  @ 19997f9ec3d0 defines it as a share of extra samples per parameter sync, not versions).
* The strict fixed lag ``rollout.staleness: k``: prime-rl ``max_async_level = k`` with
  ``orchestrator.strict_async_level = true`` (``configs/thesis/README.md``'s "fixed off-policy
  steps" runs); AReaL's ``max_head_offpolicyness`` is only a bound.
* In-flight weight updates: AReaL always interrupts running requests at a weight update and
  resubmits prompt + generated prefix (``areal/core/remote_inf_engine.py`` @ 0073c330da43,
  ``RemoteInfEngine.agenerate``: the KV is recomputed); prime-rl continues them on the engine
  (the KV kept; its default, the thesis README's "in-flight weight updates"); verl's
  ``async_training.partial_rollout`` interrupts them at a sync and continues them after it.
* Partial rollouts (slime's over-sampling): prime-rl ``orchestrator.oversampling_factor``; AReaL
  and verl have no over-sampling term (their capacity is set by η alone).

Each function returns what the target writes and the ``#`` notes for what it lacks, every note
naming its ``rollout.asynchronous.*`` field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.sampling.admission import over_sampled

if TYPE_CHECKING:
    from harness.config import RunConfig

A = "rollout.asynchronous"


def extra_groups(cfg: RunConfig) -> int:
    """The groups partial rollouts keep in flight beyond one step's, ⌈(over_sample − 1)·B⌉
    (as the harness's admission counts them)."""
    a = cfg.rollout.asynchronous
    return over_sampled(a.over_sample, cfg.rollout.prompts_per_step) if a.partial else 0


def in_flight_bound(cfg: RunConfig) -> int:
    """The most groups the harness has in flight at once: ``max_concurrent``, else what the
    capacity rule allows, (η + 1)·B + the over-sampled groups (at version v, accepted ≥ v·B)."""
    a = cfg.rollout.asynchronous
    if a.max_concurrent is not None:
        return a.max_concurrent
    return (a.max_staleness + 1) * cfg.rollout.prompts_per_step + extra_groups(cfg)


def clock_note(cfg: RunConfig, target: str) -> str:
    """Every peer overlaps sampling and training in real time: the harness's clock is how it
    emulates (virtual) or runs (threads) that overlap, not a setting of the peer."""
    a = cfg.rollout.asynchronous
    what = f"{A}.clock={a.clock}"
    if a.clock == "virtual":
        what += f" (update_time {a.update_time if a.update_time is not None else 'auto'})"
    return (
        f"# {what}: the harness's interleaving of sampler and learner; {target} overlaps them "
        "in real time, as clock: threads does"
    )


def _lag_note(cfg: RunConfig, target: str) -> list[str]:
    """Partial rollouts bound admission, not the lag of a group others overtake."""
    a = cfg.rollout.asynchronous
    if not a.partial:
        return []
    return [
        f"# {A}.partial=true (over_sample {a.over_sample}): a group that finishes after later "
        "ones keeps running into later steps, so its lag can exceed max_staleness (docs/async.md); "
        f"{target} bounds it differently, if at all"
    ]


def areal_async(cfg: RunConfig) -> tuple[dict[str, Any], list[str]]:
    """AReaL's ``rollout:`` keys and the notes. AReaL's remote engine re-prefills interrupted
    requests (in_flight + recompute is exactly its behaviour); its ``WorkflowExecutor.wait``
    takes, of the finished rollouts, the oldest submitted (``areal/core/workflow_executor.py``
    @ 0db3083b94d7, ``wait_results``); ``max_concurrent_rollouts`` defaults there to
    ``consumer_batch_size``, so the harness's bound is written out."""
    r, a = cfg.rollout, cfg.rollout.asynchronous
    if not a.enabled:
        if not r.staleness:
            return {"max_head_offpolicyness": 0}, []
        return {"max_head_offpolicyness": r.staleness}, [
            f"# rollout.staleness={r.staleness}: AReaL's max_head_offpolicyness bounds the lag "
            f"(0 to {r.staleness}, as rollout.async.max_staleness does); the harness's "
            "rollout.staleness is exactly that lag for every sample"
        ]
    out: dict[str, Any] = {
        "max_head_offpolicyness": a.max_staleness,
        "consumer_batch_size": r.prompts_per_step,
        "max_concurrent_rollouts": in_flight_bound(cfg),
    }
    notes = [clock_note(cfg, "AReaL")]
    if a.weight_updates == "between_batches":
        notes.append(
            f"# {A}.weight_updates=between_batches: AReaL interrupts running generation at every "
            "weight update and continues it under the new weights (its interruptible "
            "generation, no key to turn off); the harness lets running sequences finish first"
        )
    elif a.in_flight_kv == "keep":
        notes.append(
            f"# {A}.in_flight_kv=keep: AReaL re-prefills prompt + generated prefix after an "
            "interrupt (in_flight_kv: recompute); keeping the old KV is PipelineRL's and prime-rl's"
        )
    else:
        notes.append(
            f"# {A}.weight_updates=in_flight, in_flight_kv=recompute: AReaL's interruptible "
            "generation (always on; no key)"
        )
    if a.partial:
        notes.append(
            f"# {A}.over_sample={a.over_sample}: AReaL's capacity rule has no over-sampling term; "
            "max_concurrent_rollouts above counts the over-sampled groups, its capacity does not "
            "admit them"
        )
    else:
        notes.append(
            f"# {A}.partial=false: the harness trains on the oldest submitted groups, waiting "
            "for them; AReaL takes the oldest of those already finished"
        )
    return out, notes + _lag_note(cfg, "AReaL")


def primerl_async(cfg: RunConfig) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """prime-rl's shared (top-level) keys, its ``[orchestrator]`` keys and the notes."""
    r, a = cfg.rollout, cfg.rollout.asynchronous
    n = r.n_samples
    if not a.enabled:
        strict = r.staleness > 0
        return {"max_async_level": r.staleness}, {"strict_async_level": strict}, []
    top = {"max_async_level": a.max_staleness}
    orch: dict[str, Any] = {"strict_async_level": False}
    notes = [clock_note(cfg, "prime-rl")]
    if a.max_concurrent is not None:
        orch["max_concurrent"] = a.max_concurrent * n  # prime-rl counts rollouts (samples)
    if a.weight_updates == "between_batches":
        notes.append(
            f"# {A}.weight_updates=between_batches: prime-rl updates the engine's weights under "
            "running requests (its in-flight default); it has no switch to let them finish first"
        )
    elif a.in_flight_kv == "recompute":
        notes.append(
            f"# {A}.in_flight_kv=recompute: prime-rl keeps the running requests' KV cache "
            "across a weight update (in_flight_kv: keep); re-prefilling is AReaL's"
        )
    else:
        notes.append(f"# {A}.weight_updates=in_flight, in_flight_kv=keep: prime-rl's default")
    if a.weight_updates == "in_flight" and not a.partial:
        # A rollout spanning more policies than this is discarded; the harness's admission keeps
        # every sequence within η, so nothing the harness would train on is dropped.
        orch["max_off_policy_steps"] = a.max_staleness
    if a.partial:
        orch["oversampling_factor"] = float(a.over_sample)
        if a.weight_updates == "in_flight":
            notes.append(
                f"# {A}.partial=true: the harness never discards a continued group; prime-rl's "
                "max_off_policy_steps (default 8) discards rollouts spanning more policies"
            )
    else:
        notes.append(
            f"# {A}.partial=false: the harness trains on the oldest submitted groups, waiting "
            "for them; prime-rl has no setting for the order a step takes finished rollouts in"
        )
    return top, orch, notes + _lag_note(cfg, "prime-rl")


#: The recipe that holds verl's asynchronous trainer (its keys are under ``async_training``).
VERL_ASYNC_ENTRY = "python -m recipe.fully_async_policy.fully_async_main"


def verl_async(cfg: RunConfig) -> tuple[list[tuple[str, Any]], list[str]]:
    """verl's ``async_training.*`` overrides (for the fully-async recipe) and the notes."""
    r, p, a = cfg.rollout, cfg.ppo, cfg.rollout.asynchronous
    if not a.enabled:
        return [], []
    T = "async_training"
    kv: list[tuple[str, Any]] = [
        (f"{T}.staleness_threshold", float(a.max_staleness)),
        # one parameter sync per harness step: one local update of require_batches mini-batches
        (f"{T}.trigger_parameter_sync_step", 1),
        (f"{T}.partial_rollout", a.weight_updates == "in_flight"),
        # the behaviour log-probs are the sampler's, as the harness's ℓb
        (f"{T}.use_rollout_log_probs", True),
    ]
    if r.prompts_per_step % p.ppo_n_minibatches == 0:
        kv.insert(2, (f"{T}.require_batches", p.ppo_n_minibatches))
    notes = [
        f"# {A}.max_staleness={a.max_staleness}: run verl's recipe ({VERL_ASYNC_ENTRY}) with "
        "the async_training.* overrides; its staleness_threshold is the share of extra samples "
        "the rollouter may generate per parameter sync ((1 + threshold) x one step's), so η "
        "steps ahead is threshold η (verl recommends < 1)",
        clock_note(cfg, "verl"),
    ]
    if a.weight_updates == "in_flight":
        notes.append(
            f"# {A}.in_flight_kv={a.in_flight_kv}: verl's partial_rollout interrupts running "
            "requests at a parameter sync and continues them after it; it has no setting for "
            "their KV cache"
            + (" (and it acts only with staleness_threshold > 0)" if not a.max_staleness else "")
        )
    if a.partial:
        notes.append(
            f"# {A}.over_sample={a.over_sample}: verl has no over-sampling setting (its extra "
            "samples are staleness_threshold's); its trainer takes samples as they finish"
        )
    else:
        notes.append(
            f"# {A}.partial=false: the harness trains on the oldest submitted groups, waiting "
            "for them; verl's fully-async trainer takes samples in the order they finish"
        )
    if a.max_concurrent is not None:
        notes.append(
            f"# {A}.max_concurrent={a.max_concurrent}: verl's async_training has no cap on "
            "requests in flight"
        )
    return kv, notes + _lag_note(cfg, "verl")


#: What ``AsyncGRPOConfig`` (TRL 1.16) shares with the ``GRPOConfig`` snippet: its own fields
#: and the ``TrainingArguments`` the snippet sets (tests/peers/test_export_async.py checks them
#: against the installed class).
ASYNC_GRPO_SHARED = (
    "epsilon",
    "epsilon_high",
    "temperature",
    "num_generations",
    "max_completion_length",
    "top_p",
    "top_k",
    "learning_rate",
    "adam_beta1",
    "adam_beta2",
    "weight_decay",
    "lr_scheduler_type",
    "warmup_steps",
    "max_grad_norm",
    "max_steps",
    "seed",
    "bf16",
    "gradient_checkpointing",
    "use_cpu",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
)


def trl_async(cfg: RunConfig, grpo: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``AsyncGRPOConfig`` keyword arguments (``grpo``: the snippet's ``GRPOConfig`` ones) and the
    notes. TRL's ``AsyncGRPOTrainer`` tags each group with the version it was submitted under
    and, at consumption, drops those more than ``max_staleness`` behind
    (``async_grpo_trainer.py``, ``RolloutQueueDataset``); the harness's admission never lets a
    group get that old, so nothing the harness trains on would be dropped."""
    a = cfg.rollout.asynchronous
    if not a.enabled:
        return {}, []
    n = cfg.rollout.n_samples
    kw = {k: v for k, v in grpo.items() if k in ASYNC_GRPO_SHARED}
    kw.update(
        max_staleness=a.max_staleness,
        # TRL counts generation tasks (one sample each); written out, since its auto value is
        # max_staleness × one step's samples, not the harness's bound
        max_inflight_tasks=in_flight_bound(cfg) * n,
        weight_sync_steps=1,
        # a fixed per_device_train_batch_size per micro-batch, as GRPOConfig batches
        token_budget=0,
    )
    dropped = sorted(k for k in grpo if k not in ASYNC_GRPO_SHARED and k not in kw)
    notes = [
        f"# {A}: GRPOTrainer (args above) samples synchronously; TRL's asynchronous trainer is "
        "trl.experimental.async_grpo.AsyncGRPOTrainer (a vLLM server samples), configured by "
        "async_args below",
        clock_note(cfg, "TRL"),
    ]
    if dropped:
        notes.append(
            "# AsyncGRPOConfig has no " + ", ".join(dropped) + " (set in GRPOConfig above; "
            "AsyncGRPOTrainer's loss is its own)"
        )
    notes.append(
        f"# {A}.weight_updates={a.weight_updates} (in_flight_kv {a.in_flight_kv}): "
        "AsyncGRPOConfig syncs weights to the vLLM server every weight_sync_steps; it has no "
        "setting for running requests"
    )
    if a.partial:
        notes.append(
            f"# {A}.over_sample={a.over_sample}: AsyncGRPOConfig has no over-sampling "
            "(max_inflight_tasks above counts the over-sampled groups); it trains on groups as "
            "they finish"
        )
    else:
        notes.append(
            f"# {A}.partial=false: the harness trains on the oldest submitted groups, waiting "
            "for them; AsyncGRPOTrainer trains on groups in the order they finish"
        )
    return kw, notes + _lag_note(cfg, "TRL")


__all__ = [
    "ASYNC_GRPO_SHARED",
    "VERL_ASYNC_ENTRY",
    "areal_async",
    "clock_note",
    "extra_groups",
    "in_flight_bound",
    "primerl_async",
    "trl_async",
    "verl_async",
]
