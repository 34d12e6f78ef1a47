"""The registry of policy objectives: one declaration per objective, everything else reads it.

An objective is ONE module in this package that calls ``register(...)`` on its per-token loss
terms.  The declaration names the objective (``ppo.policy_loss``), its options block (a dataclass
of ``option``-declared fields: default, help and bounds, written once; the user sets them as
``ppo.<name>.<option>``), whether it reads the PPO-clip options (``ppo.eps_clip``...), the
importance-sampling levels and loss aggregations it allows, the step metrics it reports (and what
they mean under it), and how TRL / verl / AReaL name it.  From that the registry gives:

* the pure loss function (``Objective.loss``, ``loss_function``: ``ppo_actor_loss``...), run in
  the loss frame every objective shares (``frame``: the prologue, its ``terms``, the behaviour
  weight, ``loss_agg_mode`` and the stats contract);
* the validation of a ``PPOActorConfig`` (``validate_selection``): the name, an unselected
  objective's options left at their defaults, the level and the aggregation;
* the lookup (``lookup``), the TRL / verl / AReaL mappings (``harness.peers.trl``,
  ``harness.peers.export``), the objectives table of ``docs/objectives.md`` and the
  per-objective section of
  ``docs/metrics.md`` (``python -m harness.ppo.objectives table|metrics``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.core.configtools import check_fields
from harness.core.fields import meta as meta  # re-exported: R.meta for objective modules
from harness.core.fields import option as option  # re-exported: R.option likewise
from harness.metrics import declare_objective_stats, forget_objective_stats
from harness.ppo.objectives.frame import Context, PolicyInputs, Stats, Terms, objective_loss
from harness.ppo.objectives.loss_options import LOSS_AGG_MODES, ClipOptions, LossOptions

TermsFn = Callable[[PolicyInputs, Any, Context], Terms]


class Options:
    """Base of an objective's options block: every field's declared type and bounds are checked when the
    block is built (from YAML, ``--set`` or Python alike); a ``check()`` method adds cross-field
    rules.  A message names the option as ``<objective>.<option>``."""

    _objective = ""  # set by ``register``

    def __post_init__(self) -> None:
        # Types, choices and bounds from the declarations (a ValueError: PPOActorConfig's caller
        # adds 'ppo.'); ``check`` is left with what ties options together.
        check_fields(self, f"{self._objective}." if self._objective else "")
        check = getattr(self, "check", None)
        if check is not None:
            check()


@dataclass(frozen=True)
class Peer:
    """How a peer library names an objective.

    ``name``: its loss name ('' = chosen by ``loss_agg_mode``, TRL's PPO-clip); ``options``: our
    option → the peer's key (same value), ``None`` = the peer's names are not pinned (not
    exported); ``fixed``: option → (the only value the peer expresses, why); ``aggregations``:
    the only ``loss_agg_mode``s it expresses; ``levels``: importance-sampling level → the peer's
    name at that level (verl's ``gspo``); ``by_option``: (option, its value → the peer's name)
    where the name depends on an option; ``note``: what differs."""

    name: str
    options: Mapping[str, str] | None = field(default_factory=dict)
    fixed: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    aggregations: tuple[str, ...] | None = None
    levels: Mapping[str, str] = field(default_factory=dict)
    by_option: tuple[str, Mapping[Any, str]] | None = None
    note: str = ""

    def name_for(self, level: str, options: Any) -> str:
        """The peer's name for this configuration (``levels``, then ``by_option``)."""
        if self.by_option is not None and options is not None:
            option, names = self.by_option
            return names[getattr(options, option)]
        return self.levels.get(level, self.name)


@dataclass(frozen=True)
class Objective:
    """One registered objective (see the module docstring)."""

    name: str
    summary: str  # what it does, for the objectives table
    terms: TermsFn
    rank: int = 100  # place in listings (the objectives table, "must be one of ...")
    options: type[Any] | None = None
    clip: bool = False
    levels: tuple[str, ...] = ("token",)
    aggregations: tuple[str, ...] = LOSS_AGG_MODES
    stats: Mapping[str, str] = field(default_factory=dict)
    defaults_source: str = ""
    trl: Peer | None = None
    verl: Peer | None = None
    areal: Peer | None = None
    renamed: Mapping[str, str] = field(default_factory=dict)  # retired flat key → option

    def default_options(self) -> Any:
        return None if self.options is None else self.options()

    def option_fields(self) -> tuple[dataclasses.Field[Any], ...]:
        return () if self.options is None else dataclasses.fields(self.options)

    # ------------------------------------------------------------------ checks
    def check(self, importance_sampling_level: str, loss_agg_mode: str) -> None:
        """The level and the aggregation this objective allows (one-line ``ValueError``)."""
        if importance_sampling_level not in self.levels:
            users = [o.name for o in OBJECTIVES.values() if importance_sampling_level in o.levels]
            raise ValueError(
                f"importance_sampling_level {importance_sampling_level!r} means nothing under "
                f"policy_loss {self.name!r} (allowed with {', '.join(users)})"
            )
        if loss_agg_mode not in self.aggregations:
            raise ValueError(
                f"loss_agg_mode {loss_agg_mode!r} means nothing under policy_loss {self.name!r} "
                f"(allowed: {', '.join(self.aggregations)})"
            )

    def loss(
        self,
        logprobs: torch.Tensor,
        proximal_logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        group_ids: torch.Tensor | None = None,
        token_keep: torch.Tensor | None = None,
        **options: Any,
    ) -> tuple[torch.Tensor, Stats]:
        """The objective's pure loss of [B, T] (or [T]) inputs, options by name as
        ``LossOptions.of_call`` takes them (checked on every call: this is where they enter);
        ``group_ids`` and ``token_keep`` as ``objective_loss`` takes them."""
        return objective_loss(
            LossOptions.of_call(self, **options),
            logprobs,
            proximal_logprobs,
            old_logprobs,
            advantages,
            loss_mask,
            generator=generator,
            group_ids=group_ids,
            token_keep=token_keep,
        )


OBJECTIVES: dict[str, Objective] = {}


# The step metrics ``finish`` derives for every objective from its ``Terms`` (``silenced``,
# ``reweighted``, ``gate``): ``register`` takes what they mean under the objective by these names.
FRAME_STATS = {
    "silenced": "policy/silenced_frac",
    "reweighted": "policy/reweighted_frac",
    "gate": "policy/gate_mean",
}


def register(
    name: str,
    *,
    silenced: str | None = None,
    reweighted: str | None = None,
    gate: str | None = None,
    stats: Mapping[str, str] | None = None,
    **declaration: Any,
) -> Callable[[TermsFn], Objective]:
    """Decorator on an objective's ``terms(p, options, ctx) -> Terms``: declares and registers
    it (the keywords are ``Objective``'s fields) and returns the ``Objective``.  ``silenced``,
    ``reweighted`` and ``gate`` say what the frame's metrics of the same names
    (``FRAME_STATS``) mean under it; ``stats`` its own further metrics, listed after them."""
    meanings = {"silenced": silenced, "reweighted": reweighted, "gate": gate}
    declared = {FRAME_STATS[k]: v for k, v in meanings.items() if v is not None}

    def deco(terms: TermsFn) -> Objective:
        if name in OBJECTIVES:
            raise ValueError(f"policy objective {name!r} is registered twice")
        spec = Objective(name=name, terms=terms, stats={**declared, **(stats or {})}, **declaration)
        if spec.options is not None:
            if not (dataclasses.is_dataclass(spec.options) and issubclass(spec.options, Options)):
                raise TypeError(f"{name}: options must be a dataclass subclassing Options")
            spec.options._objective = name
            for f in dataclasses.fields(spec.options):
                if "help" not in f.metadata:
                    raise TypeError(f"{name}.{f.name}: declare it with option(default, help, ...)")
        declare_objective_stats(name, dict(spec.stats))
        ranked = sorted([*OBJECTIVES.values(), spec], key=lambda o: o.rank)
        OBJECTIVES.clear()
        OBJECTIVES.update((o.name, o) for o in ranked)
        return spec

    return deco


def unregister(name: str) -> None:
    """Remove an objective (tests that register a made-up one clean up with it)."""
    OBJECTIVES.pop(name, None)
    forget_objective_stats(name)


def lookup(name: str) -> Objective:
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(
            f"policy_loss must be one of {', '.join(OBJECTIVES)}; got {name!r}"
        ) from None


def loss_function(spec: Objective) -> Callable[..., tuple[torch.Tensor, Stats]]:
    """``spec.loss`` as a plain function named ``<name>_loss`` with the terms' docstring."""

    def fn(*args: Any, **kw: Any) -> tuple[torch.Tensor, Stats]:
        return spec.loss(*args, **kw)

    fn.__name__ = fn.__qualname__ = f"{spec.name}_loss"
    fn.__doc__ = spec.terms.__doc__
    return fn


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


def validate_selection(
    policy_loss: str,
    importance_sampling_level: str,
    loss_agg_mode: str,
    clip: Mapping[str, Any],
    blocks: Mapping[str, Any],
) -> None:
    """The config-level rules (one-line ``ValueError``): a known objective; an option of
    another objective (its block, or a PPO-clip option) left at its default, since a sweep
    would otherwise silently ignore it; the level and the aggregation the objective allows."""
    spec = lookup(policy_loss)
    clip_users = " / ".join(o.name for o in OBJECTIVES.values() if o.clip)
    if not spec.clip:
        for f in dataclasses.fields(ClipOptions):
            if clip.get(f.name, f.default) != f.default:
                raise ValueError(
                    f"{f.name} means nothing under policy_loss {policy_loss!r} (it is an option "
                    f"of {clip_users}); leave it at {_shown(f.default)}"
                )
    for other in OBJECTIVES.values():
        block = blocks.get(other.name)
        if other.name == policy_loss or block is None:
            continue
        for f in other.option_fields():
            default = getattr(other.default_options(), f.name)
            if getattr(block, f.name) != default:
                raise ValueError(
                    f"{other.name}.{f.name} means nothing under policy_loss {policy_loss!r} (it "
                    f"is an option of {other.name}); leave it at {_shown(default)}"
                )
    spec.check(importance_sampling_level, loss_agg_mode)


def renamed_keys() -> dict[str, str]:
    """Retired flat ``ppo.`` keys → their new dotted names (``cispo_ratio_max`` →
    ``cispo.ratio_max``): the config refuses the old spelling with one line naming the new."""
    return {old: f"{o.name}.{new}" for o in OBJECTIVES.values() for old, new in o.renamed.items()}


def options_of(cfg: Any, name: str) -> Any:
    """The options block of objective ``name`` in a ``PPOActorConfig`` (None if it has none)."""
    return getattr(cfg, name, None) if lookup(name).options is not None else None
