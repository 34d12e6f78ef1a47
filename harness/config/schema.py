"""The run configuration: one typed dataclass tree whose fields declare their help and bounds.

``PPOActorConfig`` uses AReaL's field names; ``RunConfig`` wraps it with the
model, task, rollout, optimizer, critic, warm start, evaluation and device settings of one PPO
training run.  The same ``RunConfig`` is what an ablation cell overrides.  Values are checked
against the declarations by ``harness.core.configtools.from_dict``; ``__post_init__`` holds only
what a declaration cannot say (files that must exist, fields that must agree).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.config.asynchrony import AsyncConfig
from harness.core.configtools import is_device_name
from harness.core.fields import option
from harness.model.engine_support import SamplerDtype
from harness.model.options import ModelOptions, TinyModelConfig
from harness.ppo.config import PPOActorConfig
from harness.ppo.corrections import Correction
from harness.tasks import field_help as task_field_help

# Every field is declared with ``option`` (help text plus the declared range, see
# harness.core.fields); every numeric field is range- and finiteness-checked from these
# declarations when a config is built.
BIG = 10_000_000  # upper bound of step-like counts: far beyond any CPU/GPU run, far below overflow


TrainerName = Literal["harness", "trl"]


@dataclass
class RolloutConfig:
    prompts_per_step: int = option(8, "Prompts sampled per training step.", ge=1, le=100_000)
    n_samples: int = option(4, "Completions per prompt (the group).", ge=1, le=10_000)
    max_new_tokens: int = option(12, "Longest completion.", ge=1, le=100_000)
    top_p: float = option(1.0, "Nucleus sampling threshold (1 = off).", gt=0, le=1)
    staleness: int = option(
        0, "Sample with the policy as it was k updates ago (emulates async RL).", ge=0, le=10_000
    )
    chat_template: str = option(
        "none",
        "none = prompts as is; auto = the tokenizer's chat template when it has one (one "
        "user turn + generation prompt); or a path to a Jinja template file (~ expanded; "
        "relative to the current directory).",
    )
    zero_variance_filter: bool = option(
        False,
        "DAPO dynamic sampling: drop the groups whose rewards are all equal (no signal under "
        "group normalization) from the update batch.",
    )
    max_resample_rounds: int = option(
        0,
        "With zero_variance_filter: extra sampling rounds of prompts_per_step prompts to "
        "refill the batch to prompts_per_step groups (0 = train on the groups left).",
        ge=0,
        le=1000,
    )
    max_prompt_tokens: int | None = option(
        None,
        "Keep only the last N tokens of longer prompts (null = never truncate; a prompt "
        "+ max_new_tokens past the model's positions is then a config error).",
        ge=1,
        le=1_048_576,
    )

    # Sources of training–inference mismatch (docs/mismatch.md): each is one grid axis.
    sampler_dtype: SamplerDtype | None = option(
        None,
        "Precision of the sampler's forward only; the learner keeps model_options.dtype. The "
        "local sampler runs under autocast to it (float32: autocast off; CPU and CUDA), the "
        "vLLM engine (sampler_backend: vllm) holds its weights in it. null = the same as "
        "model_options.dtype.",
    )
    sampler_logit_noise: float = option(
        0.0,
        "σ of seeded Gaussian noise added to the sampler's logits, before sampling and "
        "before recording behaviour log-probs (0 = off): a mismatch dose knob.",
        ge=0,
        le=100,
    )
    sampler_backend: Literal["auto", "fast", "hf", "vllm"] = option(
        "auto",
        "Decode path of the sampler: auto = the functional Llama/Qwen2/Mistral decoder when "
        "it applies, else the model's own forward; fast = insist on the former; hf = always "
        "the latter; vllm = the vLLM inference engine (optional; weights synced once per "
        "step; docs/engine.md). Also written as the rollout.sampler block.",
    )
    engine_kv_cache_gib: int = option(
        1,
        "sampler_backend vllm on CPU: GiB reserved for the engine's KV cache "
        "(VLLM_CPU_KVCACHE_SPACE; whole GiB). Checked before the run against the machine's "
        "available memory, and against one sequence of the model's full length (the engine "
        "does not start without room for it).",
        ge=1,
        le=4096,
    )
    engine_gpu_memory_utilization: float = option(
        0.3,
        "sampler_backend vllm on CUDA: the share of the GPU's memory the engine may take "
        "(weights + KV cache); the learner uses the rest.",
        gt=0,
        lt=1,
    )
    asynchronous: AsyncConfig = option(
        help="Asynchronous sampling (also written rollout.async): bounded staleness, in-flight "
        "weight updates, partial rollouts, and the clock that interleaves sampler and "
        "learner (docs/async.md).",
        factory=AsyncConfig,
    )
    measure_mismatch: bool = option(
        True,
        "Log mismatch/* each step: sampler log-probs against a learner-precision forward "
        "(one extra no-grad forward when the actor does not recompute; two under staleness).",
    )

    def __post_init__(self) -> None:
        if self.sampler_backend == "vllm":
            # What the engine cannot do as the local sampler does is refused, never approximated.
            if self.top_p < 1.0:
                raise ValueError(
                    "rollout.top_p: must be 1 with sampler_backend vllm (the engine's log-probs "
                    "under top_p < 1 are renormalised over the nucleus, unlike the learner's)"
                )
            if self.sampler_logit_noise > 0:
                raise ValueError(
                    "rollout.sampler_logit_noise: must be 0 with sampler_backend vllm (the "
                    "engine's logits cannot be perturbed)"
                )
        if self.asynchronous.enabled:
            _check_async(self)
        if self.max_resample_rounds and not self.zero_variance_filter:
            raise ValueError(
                "rollout.max_resample_rounds means nothing with rollout.zero_variance_filter "
                "false; leave it at 0"
            )
        if self.chat_template in ("auto", "none"):
            return
        self.chat_template = os.path.expanduser(self.chat_template)
        if not Path(self.chat_template).is_file():
            raise ValueError(
                f"chat_template: file {self.chat_template!r} not found (use auto, none or a path)"
            )


def _check_async(r: RolloutConfig) -> None:
    """What asynchronous sampling cannot be combined with, refused in one line."""
    if r.staleness:
        raise ValueError(
            "rollout.staleness: the strict fixed-lag mode, exclusive with rollout.async "
            "(bounded staleness, in-flight or partial); set one of the two"
        )
    if r.zero_variance_filter:
        raise ValueError(
            "rollout.zero_variance_filter: not with rollout.async (dynamic sampling's refill "
            "rounds re-sample under one version; the asynchronous sampler has no rounds)"
        )


@dataclass
class OptimConfig:
    lr: float = option(3e-4, "AdamW learning rate of the policy.", gt=0)
    weight_decay: float = option(0.0, "AdamW weight decay.", ge=0)
    beta1: float = option(0.9, "AdamW β1.", ge=0, lt=1)
    beta2: float = option(0.999, "AdamW β2.", ge=0, lt=1)
    schedule: Literal["constant", "linear", "cosine"] = option(
        "constant", "Learning-rate schedule over the run."
    )
    warmup_steps: int = option(0, "Linear warm-up, in optimizer steps.", ge=0, le=BIG)
    grad_clip: float | None = option(
        1.0, "Clip the gradient norm to this (null = no clipping).", gt=0
    )


@dataclass
class CriticConfig:
    enabled: bool = option(False, "Train a value model for GAE (PPO); off = critic-free.")
    lr: float = option(1e-3, "Critic learning rate.", gt=0)
    value_clip: float | None = option(
        0.5, "Value clipping ε_v around the old values (null = off).", gt=0
    )


@dataclass
class WarmStartConfig:
    steps: int = option(0, "Supervised steps on demonstrations before RL (0 = off).", ge=0, le=BIG)
    lr: float = option(3e-3, "Warm-start learning rate.", gt=0)
    batch_size: int = option(32, "Warm-start batch size.", ge=1, le=100_000)


@dataclass
class EvalConfig:
    every: int = option(25, "Greedy evaluation every N steps (0 = only at the end).", ge=0, le=BIG)
    n_prompts: int = option(64, "Held-out prompts per evaluation.", ge=1, le=100_000)
    threshold: float = option(
        1.0,
        "A held-out completion counts as solved (eval/accuracy, pass@k) when its reward is at "
        "least this (1.0 = fully correct on every built-in task).",
    )
    samples: int = option(
        0,
        "Completions sampled per held-out prompt at the rollout temperature, for "
        "eval/pass_at_1, eval/pass_at_k and eval/mean_at_n (0 = greedy evaluation only).",
        ge=0,
        le=1024,
    )
    k: int = option(1, "The k of eval/pass_at_k (at most eval.samples).", ge=1, le=1024)
    sampler: Literal["local", "run"] = option(
        "local",
        "What samples the evaluations during training: local = the local decoder (the same "
        "answers whatever the rollout sampler); run = the run's rollout sampler (the vLLM "
        "engine under rollout.sampler_backend: vllm, where a GPU run's time goes). The "
        "evaluation before training is always local.",
    )

    def __post_init__(self) -> None:
        if self.samples and self.k > self.samples:
            raise ValueError(
                f"eval.k ({self.k}) must be at most eval.samples ({self.samples}): pass@k "
                "needs k of the n samples"
            )


def check_segment_filters(c: Any) -> None:
    """A completion's valid tokens are one run, so a 'segment' filter decides exactly as the
    'sequence' one with the same agg, unless an earlier token-level mask filter under
    ``sequential: true`` has cut the runs the filter sees: refused there rather than offered
    as a distinct cell that cannot differ.  (``PPOActor`` batches whose loss_mask has gaps,
    e.g. multi-turn, are not checked: there every run is a segment.)"""
    if not isinstance(c, Correction):
        return
    for i, f in enumerate(c.filters):
        if f.level != "segment":
            continue
        cut = c.sequential and any(g.level == "token" and g.action == "mask" for g in c.filters[:i])
        if not cut:
            raise ValueError(
                f"ppo.correction.filters[{i}].level: 'segment' aggregates over each run of "
                "consecutive completion tokens, and a completion is one run, so it equals level "
                "'sequence' here; it differs after an earlier token-level mask filter with "
                "sequential: true; use level: sequence"
            )


@dataclass
class RunConfig:
    """One PPO training run."""

    seed: int = option(0, "Seed of model init, prompts and sampling.", ge=0, le=2**32 - 1)
    steps: int = option(200, "Training steps (rollout + update).", ge=1, le=BIG)
    model: str = option(
        "tiny",
        "'tiny' or a local Hugging Face model directory (~ expanded; a relative path is "
        "relative to the current directory, not to the YAML file).",
    )
    tiny: TinyModelConfig = option(help="Tiny model shape.", factory=TinyModelConfig)
    model_options: ModelOptions = option(
        help="How the model is loaded and run: dtype, attn_implementation, trust_remote_code, "
        "gradient_checkpointing, lora.",
        factory=ModelOptions,
    )
    task: str = option("reverse", task_field_help())
    task_options: dict[str, Any] = option(help="Task keyword options.", factory=dict)
    rollout: RolloutConfig = option(help="Sampling.", factory=RolloutConfig)
    ppo: PPOActorConfig = option(help="PPO actor.", factory=PPOActorConfig)
    optim: OptimConfig = option(help="Policy optimizer.", factory=OptimConfig)
    critic: CriticConfig = option(help="Value model.", factory=CriticConfig)
    warm_start: WarmStartConfig = option(help="SFT warm-up.", factory=WarmStartConfig)
    eval: EvalConfig = option(help="Held-out evaluation.", factory=EvalConfig)
    device: str = option("cpu", "auto | cpu | cuda | cuda:N.")
    bf16: bool = option(
        False, "Shorthand for model_options.dtype=bfloat16 (autocast, CPU and CUDA)."
    )
    threads: int = option(0, "torch CPU threads (0 = leave torch's default).", ge=0, le=1024)
    trainer: TrainerName = option(
        "harness",
        "Who trains the cell: the harness's PPO loop or TRL's GRPOTrainer (options mapped "
        "as in the table of docs/trl.md; what TRL cannot express is an error).",
    )
    diverge_after: int = option(
        3,
        "Consecutive steps whose every update was non-finite before a run counts as diverged.",
        ge=1,
        le=BIG,
    )

    def __post_init__(self) -> None:
        if self.bf16:
            self.model_options.dtype = "bfloat16"
        if self.model != "tiny":
            # YAML does no shell expansion: `model: ~/models/x` (the README's own example) would
            # otherwise name a directory literally called '~'.
            self.model = os.path.expanduser(self.model)
        dev = self.device
        if not is_device_name(dev):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {dev!r}")
        if self.model != "tiny" and not Path(self.model).is_dir():
            raise ValueError(
                f"model: directory {self.model!r} does not exist "
                "(use 'tiny' or a local Hugging Face model directory)"
            )
        if self.trainer == "trl" and self.rollout.asynchronous.enabled:
            raise ValueError(
                "rollout.async: not with trainer: trl (TRL's GRPOTrainer samples synchronously; "
                "use trainer: harness)"
            )
        check_segment_filters(self.ppo.correction)
        if self.ppo.prox_logp_method == "loglinear" and max_lag(self) < 2:
            # α = (k−1)/k is 0 for a batch sampled k <= 1 updates ago: π_prox would be π_behave
            # on every token, which is use_decoupled_loss=false under another name.
            raise ValueError(
                "ppo.prox_logp_method: 'loglinear' acts only with rollout.staleness >= 2 or "
                f"rollout.async.max_staleness >= 2 (the largest lag here is {max_lag(self)}: the "
                "interpolation weight (k-1)/k is 0 for a lag k <= 1, so π_prox would be "
                "π_behave); raise one of them or use prox_logp_method: recompute"
            )
        if (
            self.ppo.overlong_tokens is not None
            and self.ppo.overlong_tokens > self.rollout.max_new_tokens
        ):
            raise ValueError(
                f"ppo.overlong_tokens ({self.ppo.overlong_tokens}) must be at most "
                f"rollout.max_new_tokens ({self.rollout.max_new_tokens})"
            )
        for name, norm in (("adv_norm", self.ppo.adv_norm), ("reward_norm", self.ppo.reward_norm)):
            if norm is not None and norm.uses_groups:
                # The loop passes the real group sizes (to reward_norm and adv_norm alike); a
                # fixed group_size that disagrees with them would be silently ignored.
                if norm.group_size not in (1, self.rollout.n_samples):
                    raise ValueError(
                        f"ppo.{name}.group_size {norm.group_size} must equal rollout.n_samples "
                        f"({self.rollout.n_samples}) or be left at 1"
                    )


# Why clipping cannot act when ``clip_is_inert`` holds, and what makes it act: the run's
# warning and the dry run's note say it in the same words.
INERT_CLIP_WHY = (
    "one optimizer step per batch on fresh or recomputed log-probs: the ratio is identically 1"
)
INERT_CLIP_FIX = "use ppo_n_minibatches > 1, ppo_epochs > 1 or staleness"


def clip_is_inert(cfg: RunConfig) -> bool:
    """True when the configuration makes the policy ratio identically 1, so that eps_clip,
    eps_clip_higher and c_clip cannot change anything (the peers' threads on clipping that does
    nothing with one update per rollout: huggingface/trl#3120, volcengine/verl#791): a single
    optimizer step per batch sees the weights that produced ℓp — the behaviour policy itself
    when rollouts are fresh, or the recomputed proximal policy in decoupled mode."""
    p = cfg.ppo
    single_step = p.ppo_n_minibatches * p.ppo_epochs == 1
    return single_step and (max_lag(cfg) == 0 or p.recomputes_proximal)


def max_lag(cfg: RunConfig) -> int:
    """The largest lag (updates between a token's version and the learner's) the rollout
    settings allow: rollout.staleness, or the asynchronous η (a partial rollout's continued
    sequences can lag further: counted as η + 2, enough for every check that asks for 2)."""
    a = cfg.rollout.asynchronous
    if not a.enabled:
        return cfg.rollout.staleness
    return a.max_staleness + (2 if a.partial else 0)
