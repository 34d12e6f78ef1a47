"""``docs/corrections.md``, generated from the declarations (``python -m harness.ppo.corrections``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.core.configtools import to_dict
from harness.ppo.corrections.registry import PRESETS
from harness.ppo.corrections.spec import Correction, Filter


def _shown(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _diff(c: Correction) -> str:
    """The preset's block: the fields it sets away from their defaults."""
    base, d = to_dict(Correction(bypass=True)), to_dict(c)
    base["bypass"] = False
    parts = []
    for k, v in d.items():
        if k == "filters":
            for f in v:
                fd = to_dict(Filter(upper=1.0))
                fd["upper"] = None
                inner = ", ".join(f"{a}: {_shown(b)}" for a, b in f.items() if fd[a] != b)
                parts.append(f"filters: [{{{inner}}}]")
        elif v != base[k]:
            parts.append(f"{k}: {_shown(v)}")
    return "{" + ", ".join(parts) + "}"


def _fields(cls: type) -> list[str]:
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else ()
        lines.append(f"| `{f.name}` | `{_shown(default)}` | {f.metadata['help']} |")
    return lines


# The page's opening: what a correction is, where it acts, its statistics.
_INTRO = (
    "# Training–inference mismatch corrections (`ppo.correction`)",
    "",
    "Generated from `harness/ppo/corrections/` (regenerate with "
    "`python -m harness.ppo.corrections > docs/corrections.md`).",
    "",
    "A correction is one behaviour weight ρ and a list of rejection filters, evaluated inside "
    "the loss per micro-batch from ℓθ (detached), ℓp (proximal), ℓb (the sampler's "
    "log-probs) and A.  Every `ppo.policy_loss` multiplies its per-token loss, after its "
    "own clip, by ρ and sums over the narrowed mask; the `loss_agg_mode` denominators keep "
    "the dropped tokens (`denominator: pre`, AReaL/TRL/SkyRL) or lose them "
    "(`denominator: post`, verl decoupled `rollout_rs`).  log w = ℓp − ℓb, or sg(ℓθ) − ℓb "
    "under `bypass` / a filter's `reference: current`; a non-finite log w is 0 (w = 1).  "
    "`ppo.rejection_sampling` and `ppo.behave_imp_weight_mode` are particular corrections "
    "(ρ = w, or the geometric mean for sequence-level `ratio`, times one AReaL filter) and "
    "cannot be combined with `ppo.correction`.  A preset name is a grid value "
    "(`--set ppo.correction=token_tis`, `grid: {ppo.correction: [token_tis, icepop]}`).",
    "",
    "Statistics: `policy/correction_masked_frac`, `policy/correction_truncated_frac`, "
    "`policy/correction_norm_factor`, and ρ as `policy/behave_weight_{min,mean,max}`, "
    "`policy/behave_ess` (docs/metrics.md).",
    "",
)

# The presets table's heading (its rows come from the declarations).
_PRESET_TABLE_HEAD = (
    "## Presets",
    "",
    "| `ppo.correction` | what | formula | block | matches exactly |",
    "|---|---|---|---|---|",
)

# Refining a preset, corrections without the decoupled loss, the peers' settings as blocks.
_BLOCKS_AND_PEERS = (
    "",
    "## A preset with some keys changed",
    "",
    "A block may start from a preset and override some of its keys: `ppo.correction: "
    "{preset: token_tis, clip_max: 3}` is token_tis with C = 3.  On the command line and in "
    "a grid, a key set after a preset name refines that preset (`--set "
    "ppo.correction=token_tis --set ppo.correction.clip_max=3`; `grid: "
    "{ppo.correction.clip_max: [2, 3]}` over a base with `ppo.correction: token_tis`); a "
    "key set with no preset before it starts from the empty block (weight none).  A variant "
    "may do the same (`geo: {ppo.correction: seq_tis, ppo.correction.weight: "
    "sequence_geometric}`).  Whatever order the axes, a variant's keys or the `--set` flags "
    "come in, a block is set before the keys inside it, so `ppo.correction.clip_max: [2, 3]` "
    "beside a variant that sets `ppo.correction` refines that variant's block in every cell "
    "rather than being replaced by it.  No "
    "correction is `null` (YAML reads `none` as the word 'none', which names no preset).",
    "",
    "## Without the decoupled loss",
    "",
    "Every correction that reads ℓp (a weight, or a filter with `reference: proximal`) "
    "makes the actor recompute ℓp, the learner's log-probs at the parameters that start "
    "the update, even with `ppo.use_decoupled_loss: false`.  This is what TRL's "
    "`GRPOTrainer` does with `vllm_importance_sampling_correction` "
    "(`trl/trainer/grpo_trainer.py`, `_generate_and_score_completions` and `_compute_loss`): "
    "it always computes `old_per_token_logps` with the training model, weighs each token by "
    "ρ = exp(`old_per_token_logps` − `sampling_per_token_logps`) (truncated or masked to "
    "its bounds), and clips the policy ratio against `old_per_token_logps`.  In the "
    "harness's notation ℓp is that recompute, ℓb the sampler's log-probs, and the ratio is "
    "π_θ/π_p — the decoupled loss's structure, so `use_decoupled_loss: true` next to such a "
    "correction changes nothing further.  Without this, ℓp = ℓb and ρ = 1 everywhere: a "
    "grid over corrections would give identical cells.  AReaL's own weightings "
    "(`ppo.rejection_sampling`, `ppo.behave_imp_weight_mode`) keep AReaL's rule (they act "
    "only under its decoupled loss) and are refused without it.  Model-free use of "
    "`PPOActor` (the batch carries `current_logprobs`) passes ℓp as AReaL's `prox_logp` "
    "key (predicting layout); without it such a correction is refused.  `bypass` reads "
    "sg(ℓθ) instead and needs no recompute.",
    "",
    "## Other peer settings as blocks",
    "",
    "| peer setting | `ppo.correction` |",
    "|---|---|",
    "| TRL `token_truncate` [a, C] | `{weight: token, clip_min: a, clip_max: C}` |",
    "| TRL `sequence_truncate` [a, C] | `{weight: sequence_product, clip_min: a, clip_max: C}` |",
    '| verl `rollout_is=sequence`, `"lo_hi"` (sequence IcePop) | `{weight: sequence_product, '
    "clip_min: lo, clip_max: hi, zero_outside: true, log_clamp: 20}` |",
    "| verl `rollout_is_batch_normalize: true` | add `batch_normalize: true` (normalized "
    "per micro-batch: equal to verl's with `ppo_n_minibatches: 1`; verl's means, see below) |",
    '| verl `rollout_rs=token_k1`, `"lo_hi"` | `filters: [{level: token, metric: k1, lower: '
    "log lo, upper: log hi}]`, `denominator: post` |",
    "| verl `seq_{sum,mean,max}_k{2,3}` τ | `filters: [{level: sequence, metric: k2 or k3, "
    "agg: sum/mean/max, upper: τ}]`, `denominator: post` |",
    "| verl stacked `rollout_rs=a,b` | one filter per option (AND) |",
    "| verl Geo-RS-Token-TIS | `{weight: token, clip_max: C, log_clamp: 20, filters: "
    "[{level: sequence, metric: k1, agg: mean, ...}], denominator: post}` |",
    "| verl `bypass_pg_is` (bypass, reinforce, sequence TIS 2.0) | preset `bypass_pg_is` "
    "with `ppo.policy_loss: reinforce` |",
    "| verl bypass + reinforce + `rollout_is=token`, threshold C | `ppo.policy_loss: "
    "reinforce`, `{bypass: true, weight: token, clip_max: C, log_clamp: 20}` (the same "
    "gradient as `ppo.policy_loss: cispo`, `ratio_max: C`, `correction: bypass`) |",
    "| SkyRL outlier (low, high) | `sequential: true`, filters `{level: sequence, agg: max, "
    "upper: high}`, `{level: sequence, agg: min, lower: low}` first |",
    "| SkyRL token mask [low, high] | filter `{level: token, lower: low, upper: high}` |",
    "| SkyRL geometric / product mask | filter `{level: sequence, agg: mean / sum, lower, "
    "upper}` (after the above, `sequential: true`) |",
    "| SkyRL sequence TIS C | `{weight: sequence_product, clip_max: C, log_clamp: 20}` "
    "(`sequential: true` makes the product use the narrowed mask, as SkyRL) |",
    "| TRL `off_policy_mask_threshold` δ | preset `opsm` with `upper: δ` |",
    "| OpenRLHF `is_correction_level=seq`, `mask`, gating g, threshold [lo, hi] | "
    "`{weight: token, filters: [{level: sequence, agg: mean, metric: ratio / "
    "binary_kl_directed / tv, lower: lo, upper: hi}]}` (ratio: the geometric mean; a "
    "divergence: the plain mean; OpenRLHF's is_filter_ratio then counts rows, "
    "`policy/correction_masked_frac` tokens) |",
    "| OpenRLHF `is_correction_mode=clip` [lo, hi] (token ratio only) | `{weight: token, "
    "clip_min: lo, clip_max: hi}` |",
    "| ROLL `train_infer_correction.filters[]` {agg_type, ratio_low/high, diff_low/high} "
    "| one filter per enabled check, `denominator: roll` (preset `roll_infer_diff`: one "
    "token-level diff band, ±0.2): `{level, agg, metric: ratio / "
    "prob_diff, lower, upper}` with agg_type token → `level: token`, segment → `level: "
    "segment, agg: mean`, geometric → `level: sequence, agg: mean`, sequence → `level: "
    "sequence, agg: sum` (ROLL `roll/utils/train_infer_corrections.py`; its segment IS "
    "weight has no counterpart).  A completion here is one run of tokens, so `level: "
    "segment` is accepted in a run only after a token-level mask filter with "
    "`sequential: true` (which ROLL does not have); on `ppo_actor_loss` / `PPOActor` "
    "batches with gaps in the loss mask (multi-turn) each run is its own segment |",
    "| ROLL before `train_infer_correction` (`train_infer_diff_mask`, "
    "`train_infer_diff_threshold_low/high`; `train_infer_ratio_mask`, "
    "`train_infer_ratio_threshold_low/high`; `roll/pipeline/rlvr/actor_worker.py` at "
    "4dc7f5b3b26eee91eef8153894ebf3806fde1ca8) | token filters, `denominator: post` (that "
    "`loss_func` narrowed the mask before `agg_loss` counted it) |",
    "| AReaL `rejection_sampling` {level, action, metric, agg, lower, upper} | "
    "`{weight: token (sequence_geometric for sequence ratio), filters: [{level, metric "
    "(kl_kN → kN), direction: ref_behave, agg, lower, upper, action: mask / truncate}]}` |",
    "",
    "### ROLL's denominators",
    "",
    "ROLL filters in the actor's loss (`loss_func` with `enable_old_logprobs_recompute: "
    "false`): it multiplies the filter into `response_mask`, but `agg_loss` divides by "
    "`batch_num_tokens` N and `global_valid_samples` G counted before the filter "
    "(alibaba/ROLL `roll/utils/functionals.py` at 090ac94658ad14006ef7665aa922bf2668f5517c).  "
    "`denominator: roll` is that: under `seq-mean-token-mean` each row's loss is the mean over "
    "its kept tokens, Σ_t M′L / (n′ + 1e-8), 0 for a row the filter empties, and the rows "
    "are summed and divided by G + 1e-8, so an emptied row still counts; under "
    "`seq-mean-token-sum` the row sums are divided by G + 1e-8.  The 1e-8s are ROLL's as "
    "written, added in the loss's precision; ROLL adds them to int64 counts, which torch "
    "forms in float32, where they round away, so the two are at most 1e-8/n apart "
    "(relative).  The filters' own segment and sequence means divide by the exact count, "
    "which is what ROLL's int64 masks give.",
    "",
    "Under `token-mean` ROLL's `agg_loss` divides the sum of the whole, unmasked loss matrix "
    "by N: the filter leaves its policy loss unchanged (ROLL v0.2.0 on; the open fix "
    "alibaba/ROLL#444 masks the numerator).  `denominator: roll` does what that fix does, "
    "Σ M′L / N: the band acts, and a dropped token stays in the count.  Under "
    "`seq-mean-token-sum-norm` ROLL divides Σ M′L by T alone, the harness by (rows · T) "
    "with or without a correction; `prompt-mean` (not ROLL's) takes `pre`.",
    "",
)

# Where verl's arithmetic is kept to the epsilon, and the one place the harness departs.
_VERL_EDGES = (
    "### verl's epsilons and its empty denominator",
    "",
    "`batch_normalize` takes verl's means as written (verl-project/verl "
    "`verl/trainer/ppo/rollout_corr_helper.py` `compute_rollout_correction_weights` with "
    "`verl/utils/torch_functional.py` `masked_mean`): token weights are divided by "
    "Σρ/(n + 1e-8), or Σρ/n under `bypass` (verl computes those weights inside the loss, "
    "under torch.distributed, with `distributed_masked_mean`); sequence weights by the mean "
    "over non-empty rows of each row's Σρ/(n_i + 1e-8).  The 1e-8 is added in ρ's "
    "precision.  verl's trainer passes its int64 attention mask, so there n + 1e-8 is "
    "formed in float32 and rounds to n; the two therefore differ by at most 1e-8/n "
    "relative, and agree to float64 precision when verl is given a float64 mask.",
    "",
    "When the filters of a `denominator: post` correction drop every token the loss is "
    "normalised over (a micro-batch here, the mini-batch in verl), verl's `agg_loss` "
    "(`verl/trainer/ppo/core_algos.py`) divides 0 by a surviving count of 0: its loss is "
    "NaN under `token-mean`, `seq-mean-token-mean` and `seq-mean-token-sum` (0 under "
    "`seq-mean-token-sum-norm`), while its gradient stays 0 (the `torch.where` in "
    "`masked_sum` drops what the division sends back).  The harness keeps every "
    "denominator at least 1, as TRL clamps its normaliser at 1: such a micro-batch gives "
    "loss 0 and gradient 0, so the logged loss stays finite.",
    "",
)

# The segment level, after the field tables.
_SEGMENTS = (
    "### Segment level",
    "",
    "`level: segment` sits between token and sequence: a row's valid tokens are cut into "
    "maximal runs of consecutive positions, and each run is judged by the `agg` of the "
    "metric over its own tokens (for `ratio`, in log space: `mean` is the run's geometric "
    "mean), broadcast to the run's tokens.  ROLL (alibaba/ROLL "
    "`roll/utils/train_infer_corrections.py`, `_compute_all_granularity`, with the runs of "
    "`roll/pipeline/agentic/utils.py` `compute_segment_masked_mean`) offers it as one "
    "granularity of its train–infer filters, for multi-turn data where the environment's "
    "tokens are masked out and each assistant turn is a run.  The harness's tasks produce "
    "one completion per row, a single run, so on its own the level equals `sequence` with "
    "the same `agg`; a run config is therefore refused unless a token-level mask filter "
    "earlier in the list, under `sequential: true`, cuts the completion first (the runs "
    "between its dropped tokens are then the segments).  `ppo_actor_loss` and `PPOActor` "
    "batches whose loss mask has gaps take it as ROLL does.  With "
    "`negative_advantage_only`, the sign of a run is that of its mean advantage.",
    "",
)

# What `harness export` writes for a correction.
_EXPORT = (
    "## Export",
    "",
    "`harness export --to trl` writes `vllm_importance_sampling_{correction,mode,clip_min,"
    "clip_max}` (TRL applies them only with a vLLM sampler) and `off_policy_mask_threshold`; "
    "`--to verl` writes `algorithm.rollout_correction.*` (under `bypass`, also its "
    "`loss_type`: `ppo_clip` for `ppo.policy_loss: ppo`, `reinforce` for "
    "`ppo.policy_loss: reinforce`; verl's bypass mode runs no other loss).  Under "
    "`ppo.policy_loss: vespo` TRL folds ρ into VESPO's sequence weight instead of "
    "multiplying the loss by it: `ppo.vespo.behaviour_weight: fold` is that composition, "
    "the default `multiply` is named in the TRL export as not TRL's.  What a target cannot "
    "express is a `#` comment naming the field.  `trainer: trl` runs `opsm` (TRL's "
    "`off_policy_mask_threshold`); any other correction is refused there in one line "
    "(TRL's IS weights need a separate vLLM sampler).",
)


def markdown() -> str:
    """docs/corrections.md: the prose above, the presets table from their declarations and the
    field tables of :class:`Correction` and :class:`Filter` from their field metadata."""
    rows = []
    for p in PRESETS.values():
        peers = "; ".join(f"{lib} {s}" for lib, s in p.peers.items())
        req = ", ".join(f"`ppo.{k}: {_shown(v)}`" for k, v in p.requires.items())
        what = p.summary + (f" (needs {req})" if req else "")
        rows.append(f"| `{p.name}` | {what} | {p.formula} | `{_diff(p.correction)}` | {peers} |")
    lines = [
        *_INTRO,
        *_PRESET_TABLE_HEAD,
        *rows,
        *_BLOCKS_AND_PEERS,
        *_VERL_EDGES,
        "## The block",
        "",
        *_fields(Correction),
        "",
        "## A filter (`ppo.correction.filters[]`)",
        "",
        *_fields(Filter),
        "",
        *_SEGMENTS,
        *_EXPORT,
    ]
    return "\n".join(lines) + "\n"
