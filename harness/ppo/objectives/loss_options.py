"""What a policy objective's loss reads besides the tensors (``LossOptions``): the PPO-clip
options (``ClipOptions``), the level and aggregation, and the one behaviour weight, built and
checked where they enter (``PPOActorConfig.loss_options`` once, a pure ``<name>_loss`` call on
every call: ``LossOptions.of_call``).  The loss itself is :mod:`harness.ppo.objectives.frame`.

Source: AReaL ``areal/utils/functional/functional.py`` (``ppo_actor_loss_fn``), main branch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from harness.core.configtools import ConfigError, check_value, checked
from harness.core.fields import option
from harness.ppo.corrections import (
    Correction,
    RejectionSampling,
    behaviour_correction,
    resolve,
)
from harness.ppo.corrections.areal import BEHAVE_CAP, BehaveMode

if TYPE_CHECKING:
    from harness.ppo.objectives.registry import Objective

LossAggMode = Literal[
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "prompt-mean",
]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
ISLevel = Literal["token", "sequence"]
IS_LEVELS: tuple[str, ...] = get_args(ISLevel)


@dataclass(frozen=True)
@checked()
class ClipOptions:
    """The PPO-clip options, flat under ``ppo.`` (AReaL's names; ``PPOActorConfig`` takes their
    defaults and declarations from here), read by the objectives that declare ``clip=True``.
    Each option is checked from its declaration on construction (``checked``)."""

    eps_clip: float = option(0.2, "Lower clip ε: ratio clipped to [1-ε, 1+ε_hi].", gt=0)
    eps_clip_higher: float | None = option(
        None, "Upper clip ε_hi (DAPO clip-higher); null = eps_clip.", ge=0
    )
    c_clip: float | None = option(
        None, "Dual clip: caps the loss at c·|A| where A < 0; must be > 1.", gt=1
    )


CLIP_NAMES = tuple(f.name for f in dataclasses.fields(ClipOptions))


def check_behaviour_options(
    behave_imp_weight_mode: str,
    behave_imp_weight_cap: float | None,
    rejection_sampling: RejectionSampling | None,
) -> None:
    """The rules that tie AReaL's behaviour-weight options together (shared by the pure loss
    functions and ``PPOActorConfig``; each option alone is checked from its declaration)."""
    if behave_imp_weight_mode == "disabled" and behave_imp_weight_cap is not None:
        raise ValueError(
            "behave_imp_weight_cap must be null when behave_imp_weight_mode is 'disabled'; "
            f"got {behave_imp_weight_cap}"
        )
    if rejection_sampling is not None and behave_imp_weight_mode != "disabled":
        raise ValueError(
            "give either rejection_sampling or behave_imp_weight_mode, not both "
            f"(behave_imp_weight_mode={behave_imp_weight_mode!r})"
        )


# A pure call's keywords that no options block holds: the declarations of PPOActorConfig's fields.
_KEYWORDS: dict[str, tuple[Any, Any]] = {
    "behave_imp_weight_mode": (BehaveMode, {}),
    "behave_imp_weight_cap": (float | None, BEHAVE_CAP),
    "importance_sampling_level": (ISLevel, {}),
    "loss_agg_mode": (LossAggMode, {}),
}


def check_keywords(**keywords: Any) -> None:
    """Check a pure call's keywords as ``from_dict`` checks the config fields of the same name
    (one-line ``ValueError``)."""
    for name, value in keywords.items():
        tp, md = _KEYWORDS[name]
        try:
            check_value(value, tp, md, name)
        except ConfigError as err:
            raise ValueError(str(err)) from None


@dataclass(frozen=True)
class LossOptions:
    """What the loss reads besides the tensors: the objective, the PPO-clip options, the
    objective's options block (None if it has none), the level, the aggregation and the one
    behaviour weight (None = no weight).  Built once, already checked."""

    objective: Objective
    clip: ClipOptions
    options: Any
    importance_sampling_level: str = "token"
    loss_agg_mode: str = "token-mean"
    correction: Correction | None = None

    @classmethod
    def of_call(
        cls,
        spec: Objective,
        *,
        behave_imp_weight_mode: str = "disabled",
        behave_imp_weight_cap: float | None = None,
        rejection_sampling: RejectionSampling | None = None,
        importance_sampling_level: str = "token",
        loss_agg_mode: str = "token-mean",
        correction: Correction | str | None = None,
        **options: Any,
    ) -> LossOptions:
        """The keywords of a pure ``<name>_loss`` call, checked: its block's fields,
        ``eps_clip``/``eps_clip_higher``/``c_clip`` where it reads them, AReaL's two spellings
        of the behaviour weight or a ``correction`` (a block or a preset name)."""
        clip_kw = {k: options.pop(k) for k in CLIP_NAMES if k in options}
        if clip_kw and not spec.clip:
            raise TypeError(f"{spec.name}_loss() takes no {', '.join(clip_kw)}")
        if spec.options is None and options:
            raise TypeError(f"{spec.name}_loss() takes no {', '.join(options)}")
        own = spec.options(**options) if spec.options is not None else None
        clip = ClipOptions(**clip_kw)
        corr = resolve(correction)
        check_keywords(
            behave_imp_weight_mode=behave_imp_weight_mode,
            behave_imp_weight_cap=behave_imp_weight_cap,
            importance_sampling_level=importance_sampling_level,
            loss_agg_mode=loss_agg_mode,
        )
        check_behaviour_options(behave_imp_weight_mode, behave_imp_weight_cap, rejection_sampling)
        spec.check(importance_sampling_level, loss_agg_mode)
        if corr is not None and (
            rejection_sampling is not None or behave_imp_weight_mode != "disabled"
        ):
            raise ValueError(
                "give either correction or rejection_sampling / behave_imp_weight_mode, not both"
            )
        weight = behaviour_correction(
            behave_imp_weight_mode, behave_imp_weight_cap, rejection_sampling, corr
        )
        return cls(spec, clip, own, importance_sampling_level, loss_agg_mode, weight)
