"""What the report reads from a study's configuration: each cell's flattened configuration,
the sources of a training–inference mismatch it has, and the base keys held fixed across the
cells (those that can act in some cell)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.core.configtools import flatten
from harness.report.format import value_str
from harness.report.studydata import StudyData

# The YAML and --set spelling of the asynchronous block and its field name (harness.config.
# asynchrony's ASYNC_ALIAS / ASYNC_PATH): a cell's overrides may use either.
_ASYNC_ALIAS, _ASYNC_PATH = "rollout.async", "rollout.asynchronous"


def _canonical(key: str) -> str:
    """``rollout.async.x`` as the resolved configuration spells it, ``rollout.asynchronous.x``."""
    if key == _ASYNC_ALIAS or key.startswith(_ASYNC_ALIAS + "."):
        return _ASYNC_PATH + key[len(_ASYNC_ALIAS) :]
    return key


def cell_config(data: StudyData, cell: str) -> dict[str, Any]:
    """A cell's flattened configuration: the base with the cell's overrides."""
    cell_keys = {_canonical(k): v for k, v in flatten(data.cells.get(cell, {})).items()}
    return {**flatten(data.base_config), **cell_keys}


def async_on(config: dict[str, Any]) -> bool:
    """A (flattened) configuration samples asynchronously: η ≥ 1 or partial rollouts."""
    return bool(config.get(_ASYNC_PATH + ".max_staleness") or config.get(_ASYNC_PATH + ".partial"))


_REDUCED = ("bfloat16", "float16", "bf16", "fp16", "half")


def mismatch_sources(config: dict[str, Any]) -> list[str]:
    """What in a (flattened) run configuration makes the sampler's log-probs differ from the
    learner's beyond float32 rounding (docs/mismatch.md): logit noise, a sampler precision
    other than the learner's, a reduced-precision learner, a lagging behaviour policy, or the
    inference engine as the sampler."""
    out = []
    noise = config.get("rollout.sampler_logit_noise") or 0.0
    if isinstance(noise, int | float) and noise > 0:
        out.append(f"rollout.sampler_logit_noise={noise:g}")
    learner = str(config.get("model_options.dtype") or "float32")
    if config.get("bf16") is True:
        learner = "bfloat16"
    sampler = config.get("rollout.sampler_dtype")
    if sampler is not None and str(sampler) != learner:
        out.append(f"rollout.sampler_dtype={sampler} (learner {learner})")
    elif learner in _REDUCED:
        out.append(f"{learner} learner and sampler")
    staleness = config.get("rollout.staleness") or 0
    if isinstance(staleness, int | float) and staleness > 0:
        out.append(f"rollout.staleness={staleness:g}")
    if async_on(config):
        eta = config.get(_ASYNC_PATH + ".max_staleness") or 0
        out.append(f"rollout.async (max_staleness {eta}): tokens lag the learner")
    if config.get("rollout.sampler_backend") == "vllm":
        # Another program's kernels (fused attention, its own sampler) at any precision: the
        # mismatch the engine exists to measure.
        out.append("rollout.sampler_backend=vllm (the inference engine's kernels)")
    return out


def study_has_mismatch(data: StudyData) -> bool:
    """Some cell has a mismatch source: only then are the mismatch columns worth a reader's
    attention (with none, they hold float32 rounding, ~1e-13)."""
    return any(mismatch_sources(cell_config(data, c)) for c in data.cells)


# Options that cannot act in a configuration, as (key or key prefix, kept key, why, test): the
# held-fixed table leaves a key out when it is inactive in every cell, so the reader sees what
# shaped the runs and not the defaults of machinery that was off.
_INACTIVE: tuple[tuple[str, str, str, Callable[[dict[str, Any]], bool]], ...] = (
    ("tiny.", "", "the tiny model is not used", lambda c: c.get("model") != "tiny"),
    ("critic.", "critic.enabled", "the critic is off", lambda c: not c.get("critic.enabled")),
    (
        "warm_start.",
        "warm_start.steps",
        "no warm start",
        lambda c: not c.get("warm_start.steps"),
    ),
    ("eval.k", "", "no sampled eval (eval.samples 0)", lambda c: not c.get("eval.samples")),
    (
        "ppo.behave_imp_weight_cap",
        "",
        "behaviour weights disabled",
        lambda c: c.get("ppo.behave_imp_weight_mode") in (None, "disabled"),
    ),
    (
        "ppo.overlong_",
        "ppo.overlong_reward_penalty",
        "no overlong penalty",
        lambda c: not c.get("ppo.overlong_reward_penalty"),
    ),
    (
        "ppo.kl_estimator",
        "",
        "no KL penalty (ppo.kl_ctl 0)",
        lambda c: not c.get("ppo.kl_ctl"),
    ),
    (
        "rollout.max_resample_rounds",
        "",
        "no zero-variance filter",
        lambda c: not c.get("rollout.zero_variance_filter"),
    ),
    (_ASYNC_PATH + ".", "", "synchronous sampling (rollout.async off)", lambda c: not async_on(c)),
)


def _objective_block(key: str) -> str | None:
    """``cispo`` for ``ppo.cispo.ratio_max``: the options block of one policy loss."""
    parts = key.split(".")
    if len(parts) == 3 and parts[0] == "ppo" and parts[1] != "correction":
        return parts[1]
    return None


def held_fixed(data: StudyData) -> tuple[list[tuple[str, str]], list[str]]:
    """The base configuration's keys no cell varies that can act in some cell, and (why) the
    groups of keys left out because they are inactive in every cell: other objectives' option
    blocks, a model that is not used, machinery that is off."""
    varied = varied_keys(data)
    base = flatten(data.base_config)
    if "steps" in base:  # every run used the study's steps, not the base config's
        base["steps"] = data.steps
    configs = [cell_config(data, c) for c in data.cells] or [base]
    losses = {str(c.get("ppo.policy_loss", "ppo")) for c in configs}
    kept: list[tuple[str, str]] = []
    left_out: dict[str, list[str]] = {}
    for k, v in base.items():
        if k in varied:
            continue
        block = _objective_block(k)
        if block is not None and block not in losses:
            left_out.setdefault(f"options of unused policy losses ({block}", []).append(k)
            continue
        why = next(
            (
                reason
                for prefix, keep, reason, off in _INACTIVE
                if k.startswith(prefix) and k != keep and all(off(c) for c in configs)
            ),
            None,
        )
        if why is not None:
            left_out.setdefault(why, []).append(k)
            continue
        kept.append((k, value_str(v)))
    blocks = sorted(
        {g.split("(")[1] for g in left_out if g.startswith("options of unused policy losses")}
    )
    notes = [
        f"{len(ks)} key{'s' if len(ks) != 1 else ''}: {why}"
        for why, ks in left_out.items()
        if not why.startswith("options of unused policy losses")
    ]
    if blocks:
        n = sum(len(ks) for g, ks in left_out.items() if g.startswith("options of unused"))
        notes.insert(0, f"{n} keys: options of the policy losses not used ({', '.join(blocks)})")
    return kept, notes


def varied_keys(data: StudyData) -> set[str]:
    """Config keys that differ between runs: the grid's overrides and the run seed."""
    keys = {_canonical(k) for k in data.axes if k != "variant"} | {"seed"}
    for ov in data.cells.values():
        keys |= {_canonical(k) for k in flatten(ov)}
    return keys
