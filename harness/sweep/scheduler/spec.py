"""The study contract: one frozen, typed ``StudySpec`` (a grid or a search), stored as JSON on the
Optuna study and read back by every worker, ``status``, ``report`` and ``export``.

It is the only thing the harness stores on a study (besides the parent-run id, the grid hash and
the command line, which ``open_study`` also keeps as plain attrs for other tools), and
:meth:`StudySpec.run_config` is the only place a ``RunConfig`` is built from a cell (or a
sampled search point) and a seed.  Reading a study needs this module and Optuna, never the
worker.

    spec = load_study_spec(optuna.load_study(study_name="clip", storage=storage))
    cfg = spec.cell_config("eps_clip=0.2 c_clip=3", seed=0)   # grid
    cfg = spec.run_config({"ppo.eps_clip": 0.13}, seed=0)     # any point
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

import harness.run.trainers  # noqa: F401 - each trainer's checks, loaded before a cell is built
from harness.config import RunConfig, apply_overrides, build_run_config
from harness.config.experiment import ExperimentSpec
from harness.config.experiment_schema import SearchParam, SearchSpec
from harness.core.configtools import ConfigError, check_value, to_dict
from harness.core.fields import meta
from harness.core.redact import redact_url
from harness.report.allocation import AdaptivePlan

if TYPE_CHECKING:
    import optuna

# Study user attrs (the study schema).
SPEC_ATTR = "harness.spec"  # StudySpec.to_json()
PARENT_ATTR = "harness.parent_run_id"  # the MLflow parent run
HASH_ATTR = "harness.grid_hash"  # identity of what the study computes
COMMAND_ATTR = "harness.command"  # the command line that ran the sweep (shown in its report)
SCHEMA = 2  # the stored spec's format; a study made under another one is refused in one line

StudyKind = Literal["grid", "search"]


def heartbeat_interval_from_env() -> int:
    """Seconds between trial heartbeats for a new study (``HARNESS_HEARTBEAT_S``, default 5).

    Read once, when a study's spec is made; every worker then uses the study's value, so all
    of them beat and judge staleness on one clock."""
    raw = os.environ.get("HARNESS_HEARTBEAT_S", "5")
    value = int(raw) if raw.strip().lstrip("+-").isdigit() else raw
    return check_value(value, int, meta("Heartbeat seconds.", ge=1), "HARNESS_HEARTBEAT_S")


# What a search study samples: the experiment file's own classes (one description of a point).
SearchPlan = SearchSpec


@dataclass(frozen=True)
class StudySpec:
    """Everything any worker, anywhere, needs to run any trial of a study.  Read-only: the
    mappings are never mutated (configs are built on deep copies)."""

    kind: StudyKind
    experiment: str  # the experiment file's name: MLflow experiment of every run
    description: str
    grid_hash: str
    base: Mapping[str, Any]  # the base RunConfig, fully resolved (every default filled in)
    seeds: tuple[int, ...]
    steps: int
    metric: str  # ranking metric (a search: its first objective)
    direction: str  # maximize | minimize
    axes: Mapping[str, list[Any]] = field(default_factory=dict)  # grid only
    cells: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # label -> overrides
    choices: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # label -> axis -> value
    baseline: str | None = None
    search: SearchPlan | None = None  # search only
    tracking_uri: str | None = None  # password-redacted; workers pass their own when needed
    max_retries: int = 0  # re-runs of a trial that failed with an error (grid)
    heartbeat_interval: int = 5  # seconds; every worker of the study beats on this clock
    parent_run_id: str | None = None
    # seeds: {min, max, batch, decide, confidence, margin} (grid): seeds run until decided
    adaptive: Mapping[str, Any] | None = None

    # -- building -------------------------------------------------------------------------

    @classmethod
    def from_experiment(
        cls,
        spec: ExperimentSpec,
        *,
        tracking_uri: str | None = None,
        max_retries: int = 0,
        heartbeat_interval: int = 5,
    ) -> StudySpec:
        search = spec.search
        metric, direction = search.objectives[0] if search else (spec.metric, spec.direction)
        return cls(
            kind="search" if search else "grid",
            experiment=spec.name,
            description=spec.description,
            grid_hash=spec.grid_hash(),
            base=to_dict(build_run_config(spec.base)),
            seeds=tuple(spec.seeds),
            steps=spec.steps,
            metric=metric,
            direction=direction,
            axes={} if search else dict(spec.axes),
            cells={} if search else {c.label: dict(c.overrides) for c in spec.cells},
            choices={} if search else {c.label: dict(c.choice) for c in spec.cells},
            baseline=None if search else spec.baseline,
            search=search,
            tracking_uri=redact_url(tracking_uri) if tracking_uri else None,
            max_retries=max_retries,
            heartbeat_interval=heartbeat_interval,
            adaptive=None if spec.adaptive is None else dict(spec.adaptive),
        )

    def with_parent(self, run_id: str | None) -> StudySpec:
        return replace(self, parent_run_id=run_id)

    # -- the one place a RunConfig is built ------------------------------------------------

    def run_config(
        self,
        overrides: Mapping[str, Any],
        seed: int | None,
        *,
        device: str | None = None,
        threads: int | None = None,
    ) -> RunConfig:
        """Base + ``overrides`` (dotted paths) + seed and steps, on a deep copy, validated.
        ``seed=None`` keeps the base's seed (an exported configuration).

        ``device`` (a worker's device) wins over the config's; ``threads`` applies only where
        the config leaves it unset, so a study's results do not depend on which worker ran
        them.  Raises ``ConfigError`` for a point the config rejects."""
        fixed = {"steps": self.steps} if seed is None else {"seed": seed, "steps": self.steps}
        data = apply_overrides(dict(self.base), {**overrides, **fixed})
        if device:
            data["device"] = device
        if not data.get("threads") and threads:
            data["threads"] = threads
        return build_run_config(data)

    def cell_config(
        self, cell: str, seed: int, *, device: str | None = None, threads: int | None = None
    ) -> RunConfig:
        if cell not in self.cells:
            raise ConfigError(f"cell: {cell!r} is not a cell of study {self.experiment!r}")
        return self.run_config(self.cells[cell], seed, device=device, threads=threads)

    # -- facts ------------------------------------------------------------------------------

    @property
    def objectives(self) -> tuple[tuple[str, str], ...]:
        return self.search.objectives if self.search else ((self.metric, self.direction),)

    @property
    def directions(self) -> list[str]:
        return [d for _, d in self.objectives]

    def adaptive_plan(self) -> Any:
        """The study's ``AdaptivePlan`` (harness.report.allocation), None for fixed seeds."""
        if self.adaptive is None:
            return None

        return AdaptivePlan.from_dict(self.adaptive)

    @property
    def expected_trials(self) -> int:
        """Trials the study is done at: cells x seeds (grid) or n_trials (search)."""
        if self.search is not None:
            return self.search.n_trials
        return len(self.cells) * len(self.seeds)

    # -- storage ----------------------------------------------------------------------------

    def to_json(self) -> str:
        data = asdict(self)
        data["schema"] = SCHEMA
        return json.dumps(data, default=str)

    @classmethod
    def from_json(cls, text: str) -> StudySpec:
        """Parse a stored spec (``ConfigError`` for one of another schema)."""
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ConfigError("study: its stored spec is not a mapping")
        if d.get("schema") != SCHEMA:
            raise ConfigError(
                f"study: its stored spec has schema {d.get('schema', 1)} (an older harness); this "
                f"harness reads schema {SCHEMA}: run the experiment again under a new --study-name"
            )
        kind: StudyKind = "search" if d["kind"] == "search" else "grid"
        search = None
        if kind == "search":
            raw = d["search"]
            search = SearchPlan(
                n_trials=int(raw["n_trials"]),
                params=tuple(
                    SearchParam(**{**p, "choices": p.get("choices") and tuple(p["choices"])})
                    for p in raw.get("params", [])
                ),
                objectives=tuple((m, dr) for m, dr in raw.get("objectives", [])),
                pruner=raw.get("pruner", "median"),
                sampler_seed=int(raw.get("sampler_seed", 0)),
            )
        # Every stored field as stored; a null or absent one takes the field's default.
        fixed = {"kind", "search", "seeds", "description", "grid_hash"}
        known = {f.name for f in fields(cls)} - fixed
        return cls(
            **{k: v for k, v in d.items() if k in known and v is not None},
            kind=kind,
            description=d.get("description", ""),
            grid_hash=d.get("grid_hash", ""),
            search=search,
            seeds=tuple(int(s) for s in d["seeds"]),
        )


def has_study_spec(study: optuna.Study) -> bool:
    return SPEC_ATTR in study.user_attrs


def load_study_spec(study: optuna.Study) -> StudySpec:
    """The spec stored on an Optuna study (``ConfigError`` if the harness did not make it)."""
    text = study.user_attrs.get(SPEC_ATTR)
    if text is None:
        raise ConfigError(
            f"study: {study.study_name!r} was not made by `harness ablate` or `search`"
        )
    return StudySpec.from_json(text)


def trial_key(t: Any) -> tuple[str, int] | None:
    """(cell, seed) of a grid trial; None for any other trial."""
    ua = t.user_attrs
    if "cell" not in ua or "seed" not in ua:
        return None
    return ua["cell"], int(ua["seed"])
