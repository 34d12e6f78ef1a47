"""Named corrections (``ppo.correction: token_tis``): each declared once, in the module of its
family, with the peer settings it reproduces exactly.  The docs table
(``python -m harness.ppo.corrections``), the "must be one of" message and the grid values all
read ``PRESETS``; the export mapping reads the expanded ``Correction`` (so a hand-written block
exports the same way)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.core.configtools import to_dict
from harness.ppo.corrections.spec import Correction, Filter, Weight


@dataclass(frozen=True)
class Preset:
    """``name`` the grid value, ``summary`` one line, ``formula`` ρ and the filters in the
    docs' notation, ``correction`` what it expands to, ``peers`` library → the setting it
    matches exactly (and any caveat), ``requires`` the other ``ppo.`` settings it assumes."""

    name: str
    summary: str
    formula: str
    correction: Correction
    peers: Mapping[str, str] = field(default_factory=dict)
    requires: Mapping[str, object] = field(default_factory=dict)
    rank: int = 100


PRESETS: dict[str, Preset] = {}


def preset(p: Preset) -> Preset:
    """Register ``p`` (a name may be declared once)."""
    if p.name in PRESETS:
        raise ValueError(f"correction preset {p.name!r} is declared twice")
    ranked = sorted([*PRESETS.values(), p], key=lambda x: x.rank)
    PRESETS.clear()
    PRESETS.update((x.name, x) for x in ranked)
    return p


# A weight's two levels as the peers spell them (TRL's ``vllm_importance_sampling_mode``, verl's
# ``rollout_is``, SkyRL's ``tis_ratio_type``) → the prefix of the preset's name and its weight.
LEVELS: dict[str, tuple[str, Weight]] = {
    "token": ("token", "token"),
    "sequence": ("seq", "sequence_product"),
}


def level_presets(
    family: str,
    *,
    token: tuple[str, str],
    sequence: tuple[str, str],
    rank: int,
    peers: Callable[[str, str], Mapping[str, str]],
    **correction: Any,
) -> list[Preset]:
    """Register ``token_<family>`` and ``seq_<family>``: the family's ``correction`` with each
    level's weight (``LEVELS``), its ``(summary, formula)`` and its peer settings
    ``peers(level, prefix)``; ranked ``rank`` and ``rank + 1``, token level first."""
    out = []
    for offset, (level, (summary, formula)) in enumerate(
        (("token", token), ("sequence", sequence))
    ):
        prefix, weight = LEVELS[level]
        out.append(
            preset(
                Preset(
                    f"{prefix}_{family}",
                    summary,
                    formula,
                    Correction(weight=weight, **correction),
                    peers=peers(level, prefix),
                    rank=rank + offset,
                )
            )
        )
    return out


def row_filter(metric: str, **bounds: Any) -> Filter:
    """A sequence-level filter on ``metric``'s mean over the row's valid tokens (``bounds``:
    the rest of ``Filter``)."""
    # ``metric`` is checked against Filter's declared choices when the Filter is built.
    return Filter(level="sequence", metric=metric, agg="mean", **bounds)  # type: ignore[arg-type]


def preset_block(name: str) -> dict[str, Any]:
    """The preset's correction as a plain config block (what ``{preset: NAME, ...}`` starts
    from before its own keys override)."""
    block: dict[str, Any] = to_dict(PRESETS[name].correction)
    return block


def resolve(value: Correction | str | None) -> Correction | None:
    """A preset name → its correction; a block or None unchanged (``ValueError`` naming the
    presets otherwise)."""
    if value is None or isinstance(value, Correction):
        return value
    try:
        return PRESETS[value].correction
    except (KeyError, TypeError):
        # YAML reads `none` as the string 'none'; no correction is YAML's null.
        hint = (
            " (no correction is null, e.g. --set ppo.correction=null)"
            if str(value).lower() in ("none", "off", "disabled", "false")
            else ""
        )
        raise ValueError(
            f"correction must be a mapping or one of {', '.join(PRESETS)}; got {value!r}{hint}"
        ) from None
