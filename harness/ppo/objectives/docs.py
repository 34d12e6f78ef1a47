"""The objectives table of ``docs/objectives.md`` and ``docs/metrics.md``, generated from the registry."""

from __future__ import annotations

from dataclasses import fields

from harness import metrics
from harness.ppo.objectives.loss_options import ClipOptions
from harness.ppo.objectives.registry import OBJECTIVES, Objective, _shown


def _options_cell(o: Objective) -> str:
    parts = [
        f"`ppo.{o.name}.{f.name}` {_shown(getattr(o.default_options(), f.name))}"
        for f in o.option_fields()
    ]
    if o.clip and not parts:  # PPO-clip itself: its options are the flat clip ones
        parts = [f"`ppo.{f.name}` {_shown(f.default)}" for f in fields(ClipOptions)]
    text = ", ".join(parts)
    if o.defaults_source:
        text += f" ({o.defaults_source})" if text else o.defaults_source
    if o.clip and o.option_fields():
        text += ("; " if text else "") + "uses `eps_clip*`, `c_clip`"
    return text or "-"


def _peers_cell(o: Objective) -> str:
    out = []
    for lib, peer in (("AReaL", o.areal), ("TRL", o.trl), ("verl", o.verl)):
        if peer is None:
            continue
        if lib == "TRL" and not peer.name:
            out.append("TRL `dapo`/`grpo`/`dr_grpo`")
        elif lib == "TRL":
            out.append(f'TRL `loss_type="{peer.name}"`')
        elif lib == "verl":
            by = list(peer.by_option[1].values()) if peer.by_option else [peer.name]
            names = [*by, *peer.levels.values()]
            out.append("verl " + "/".join(f"`{n}`" for n in names))
        else:
            out.append(lib)
    return ", ".join(out) or "-"


_COMMON = ("policy/silenced_frac", "policy/reweighted_frac")


def objectives_markdown() -> str:
    """The objectives table of ``docs/objectives.md`` (``python -m harness.ppo.objectives table``)."""
    lines = [
        "| `ppo.policy_loss` | what it does | its options (default, source) | levels | reports | peer |",
        "|---|---|---|---|---|---|",
    ]
    for o in OBJECTIVES.values():
        name = f"`{o.name}`" + (" (default)" if o.name == "ppo" else "")
        stats = ", ".join(f"`{k}`" for k in o.stats if k not in _COMMON)
        lines.append(
            f"| {name} | {o.summary} | {_options_cell(o)} | {', '.join(o.levels)} | "
            f"{stats or '-'} | {_peers_cell(o)} |"
        )
    return "\n".join(lines) + "\n"


def metrics_markdown() -> str:
    """``docs/metrics.md`` (``python -m harness.ppo.objectives metrics``): the vocabulary, with
    the per-objective section the registered objectives declare."""
    return metrics.markdown()
