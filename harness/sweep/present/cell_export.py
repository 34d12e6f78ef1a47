"""``harness export`` of one cell: the cell's ``RunConfig`` in a peer's format
(:mod:`harness.peers.export` writes each target), plus a comment for every changed setting the
target's text would otherwise drop.  Lives above the config layer: it rebuilds the cell with one
setting back at its default to see whether the target's text depends on it."""

from __future__ import annotations

import copy

from harness.config import RunConfig
from harness.config.loading import build_run_config
from harness.core.configtools import ConfigError, flatten, set_path, to_dict
from harness.core.fields import field_defaults
from harness.peers.export import EXPORTERS, TARGETS, comment, one_line

# Not carried by any export (the module docstring: the algorithm, its budget and how the model
# is trained): a prefix ending in "." covers a block.
NOT_EXPORTED = (
    "seed",
    "model",
    "tiny.",
    "model_options.attn_implementation",
    "model_options.trust_remote_code",
    "task",
    "task_options",
    "rollout.sampler_backend",
    "rollout.measure_mismatch",
    "eval.",
    "device",
    "bf16",
    "threads",
    "trainer",
    "diverge_after",
)


def _skipped(path: str) -> bool:
    return any(path == k or (k.endswith(".") and path.startswith(k)) for k in NOT_EXPORTED)


def _named(path: str, notes: str) -> bool:
    parent = path.rsplit(".", 1)[0]
    return path in notes or (parent.count(".") >= 1 and parent in notes)


def unmapped_notes(cfg: RunConfig, target: str, body: str) -> list[str]:
    """A ``#`` line for each setting the cell changes from its default that ``body`` neither
    writes nor names: the export with that one setting back at its default is the same text.
    (A setting that cannot go back alone, such as an overlong_tokens that the penalty needs,
    is left to the target's own notes.)"""
    exporter = EXPORTERS[target]
    notes = " ".join(ln for ln in body.splitlines() if ln.startswith("#"))
    data = to_dict(cfg)
    values = flatten(data)
    out = []
    for path, default in field_defaults(RunConfig).items():
        if _skipped(path) or path not in values or values[path] == to_dict(default):
            continue
        if _named(path, notes):
            continue
        reset = copy.deepcopy(data)
        set_path(reset, path, to_dict(default))
        try:
            same = exporter(build_run_config(reset)) == body
        except (ConfigError, ValueError):
            continue
        if same:
            out.append(
                f"# {path}={one_line(values[path])}: {target} has no option this export maps "
                "it to; not exported"
            )
    return out


def export_cell(cfg: RunConfig, target: str, header: list[str] | tuple[str, ...] = ()) -> str:
    """The cell in ``target``'s format, ``header`` lines first as (one-line) comments; any
    changed setting the target's text would otherwise drop is named in a comment."""
    if target not in EXPORTERS:
        raise ValueError(f"--to must be one of {', '.join(TARGETS)}; got {target!r}")
    body = EXPORTERS[target](cfg)
    extra = "".join(comment(n.removeprefix("# ")) + "\n" for n in unmapped_notes(cfg, target, body))
    return "".join(comment(h) + "\n" for h in header) + extra + body
