"""Which grid trials a worker trains together on one base model (``--cells-per-worker K``).

A worker claims a trial as always (:func:`harness.sweep.scheduler.trials.next_trial`), then up to
K - 1 more WAITING trials that can share its base (:func:`claim_packmates`): their configs have
the same :func:`harness.run.packing.pack_key` (model, task, rollout shape, seed, ...) and each
can be packed at all (LoRA, the harness's trainer, no ``rollout.async``).  Fewer
compatible trials waiting: it takes what there is (K is a maximum).  An adaptive grid's held
seeds stay held: a packmate must be released as the first trial was.

The dry run's side of the same rule: :func:`plan_packs` groups a grid's cells as the workers
will claim them (the trials of one seed, cell order, K at a time), :func:`check_packing` refuses
a grid in which no cell can pack, and :func:`pack_memory` is the memory one pack holds.

``harness.run.packing`` (and with it the training stack) is imported only when K > 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial

from harness.core.configtools import ConfigError
from harness.core.db import with_retries
from harness.sweep.scheduler.adaptive import cell_states, releasable
from harness.sweep.scheduler.spec import StudySpec, trial_key
from harness.sweep.stores.optuna_adapter import claim_waiting_trial

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.config.experiment import ExperimentSpec

# Concurrent trials of a sweep: --workers x --cells-per-worker.  The same bound as --workers
# alone (launch_checks.MAX_WORKERS): each trial holds a run in memory, packed or not.
MAX_CONCURRENT_TRIALS = 256


def why_unpackable(cfg: RunConfig) -> str | None:
    """Why a run of ``cfg`` cannot be packed with any other (one line naming the field), or
    None when it can."""
    from harness.run.packing import check_packable  # noqa: PLC0415 - loads the training stack: only when packing

    try:
        check_packable([cfg])
    except ValueError as err:
        return str(err).splitlines()[0]
    return None


class PackKeys:
    """The pack key of each (cell, seed) of a grid study as one worker builds its configs; None
    for a trial that cannot pack (or whose config does not build).  Cached: a worker looks at
    the same waiting trials at every claim."""

    def __init__(self, spec: StudySpec, *, device: str | None, threads: int) -> None:
        self.spec, self.device, self.threads = spec, device, threads
        self._keys: dict[tuple[str, int], Any] = {}

    def __call__(self, cell: str, seed: int) -> Any:
        if (cell, seed) not in self._keys:
            from harness.run.packing import pack_key  # noqa: PLC0415 - loads the training stack: only when packing

            try:
                cfg = self.spec.cell_config(cell, seed, device=self.device, threads=self.threads)
            except ConfigError:
                key = None  # its own trial fails with the reason; it packs with nothing
            else:
                key = pack_key(cfg) if why_unpackable(cfg) is None else None
            self._keys[(cell, seed)] = key
        return self._keys[(cell, seed)]


def claim_packmates(
    study: optuna.Study,
    spec: StudySpec,
    first: tuple[str, int],
    k: int,
    keys: PackKeys,
) -> list[optuna.Trial]:
    """Claim up to ``k - 1`` WAITING trials of the grid ``study`` that can share a base with
    the claimed trial of (cell, seed) ``first``; [] when that one cannot pack."""
    if k <= 1 or spec.kind != "grid":
        return []
    want = keys(*first)
    if want is None:
        return []
    states = None
    if spec.adaptive is not None:  # a held seed stays held: only released ones are packmates
        states = cell_states(with_retries(lambda: study.get_trials(deepcopy=False)), spec)

    def accept(t: FrozenTrial) -> bool:
        key = trial_key(t)
        if key is None or key[1] != first[1]:  # the seed is a base field: a quick refusal
            return False
        if states is not None and not releasable(t, states):
            return False
        return bool(keys(*key) == want)

    mates: list[optuna.Trial] = []
    while len(mates) < k - 1:
        trial = with_retries(lambda: claim_waiting_trial(study, accept=accept))
        if trial is None:
            break
        mates.append(trial)
    return mates


# -- the dry run ---------------------------------------------------------------------------


@dataclass
class PackPlan:
    """How a grid's cells share workers at ``k`` cells per worker (the trials of each seed)."""

    k: int
    packs: list[list[str]] = field(default_factory=list)  # cell labels, K at most each
    alone: dict[str, str] = field(default_factory=dict)  # cell -> why it cannot pack
    apart: list[tuple[list[str], str, str]] = field(default_factory=list)  # (cells, vs, field)

    @property
    def groups(self) -> list[list[str]]:
        """Every pack and every cell that runs alone, each a list of labels."""
        return [*self.packs, *([c] for c in self.alone)]


def plan_packs(exp: ExperimentSpec, k: int) -> PackPlan:
    """The cells of ``exp`` as the workers pack them at ``k`` per worker: cells whose configs
    share every base field, K at a time in cell order; cells that cannot pack alone, with the
    reason; and, for each set of compatible cells beyond the first, the field that keeps it
    apart from the first set."""
    from harness.run.packing import incompatible_field, pack_key  # noqa: PLC0415 - loads the training stack: only when packing

    spec = StudySpec.from_experiment(exp)
    seed = exp.seeds[0]  # the seed is a base field: every seed packs its cells alike
    plan = PackPlan(k=k)
    by_key: dict[Any, list[tuple[str, RunConfig]]] = {}
    for cell in exp.cells:
        cfg = spec.cell_config(cell.label, seed)
        why = why_unpackable(cfg) if k > 1 else "--cells-per-worker is 1"
        if why is not None:
            plan.alone[cell.label] = why
            continue
        by_key.setdefault(pack_key(cfg), []).append((cell.label, cfg))
    sets = list(by_key.values())
    for i, members in enumerate(sets):
        labels = [label for label, _ in members]
        plan.packs += [labels[j : j + k] for j in range(0, len(labels), k)]
        if i:
            differs = incompatible_field(sets[0][0][1], members[0][1]) or "?"
            plan.apart.append((labels, sets[0][0][0], differs))
    return plan


def check_packing(exp: ExperimentSpec, k: int, workers: int) -> PackPlan | None:
    """``--cells-per-worker k`` against the experiment ``exp`` and ``--workers``: raises
    ConfigError (one line) when k is out of range, when workers x k exceeds
    :data:`MAX_CONCURRENT_TRIALS`, when no cell of the grid can pack (the first cell's reason),
    or when a search's points cannot share a base (:func:`check_search_packing`); returns a
    grid's plan when k > 1, else None (a search's points pack as the workers sample them)."""
    from harness.config.experiment_schema import MAX_CELLS_PER_WORKER  # noqa: PLC0415 - config only

    if not 1 <= k <= MAX_CELLS_PER_WORKER:
        raise ConfigError(
            f"--cells-per-worker: must be an integer in [1, {MAX_CELLS_PER_WORKER}]; got {k}"
        )
    if k == 1:
        return None
    if workers * k > MAX_CONCURRENT_TRIALS:
        raise ConfigError(
            f"--cells-per-worker: {workers} workers x {k} cells per worker = {workers * k} "
            f"trials at once; at most {MAX_CONCURRENT_TRIALS}"
        )
    if exp.search is not None:
        check_search_packing(exp, k)
        return None
    plan = plan_packs(exp, k)
    if not plan.packs:
        first = next(iter(plan.alone.values()))
        raise ConfigError(f"--cells-per-worker {k}: no cell of the grid can pack: {first}")
    return plan


def base_field_of(path: str) -> str | None:
    """The base field (:data:`harness.run.packing.BASE_FIELDS`) that the run-config path
    ``path`` (a search parameter, aliases and ``rollout.sampler`` keys included) sets or lies
    under, or None when packed runs may differ in it."""
    from harness.config.loading import SAMPLER_BLOCK, SAMPLER_KEYS, is_sampler_path, resolve_alias  # noqa: PLC0415 - config only
    from harness.run.packing import BASE_FIELDS  # noqa: PLC0415 - loads the training stack: only when packing

    full = resolve_alias(path)
    if is_sampler_path(full):  # the block stands for flat rollout fields (its backend: a base one)
        full = SAMPLER_KEYS.get(full[len(SAMPLER_BLOCK) + 1 :], "rollout.sampler_backend")
    for f in BASE_FIELDS:
        if full == f or full.startswith(f + ".") or f.startswith(full + "."):
            return f
    return None


def check_search_packing(exp: ExperimentSpec, k: int) -> None:
    """A search packs its sampled points seed by seed, so every point's runs of one seed must
    share a base: raises ConfigError (one line naming the parameter) when a sampled parameter
    is a base field, or when the search's runs cannot pack (no LoRA, ...: checked at every end
    of each range and every choice, as the file's validation builds them)."""
    assert exp.search is not None
    for param in exp.search.params:
        field_ = base_field_of(param.path)
        if field_ is not None:
            raise ConfigError(
                f"--cells-per-worker {k}: search.params.{param.path} is a base field "
                f"({field_}): the points a worker packs share one base model, so they cannot "
                "differ in it; search it with --cells-per-worker 1"
            )
    spec = StudySpec.from_experiment(exp)
    points: list[tuple[str, dict[str, Any]]] = [("", {})]
    for param in exp.search.params:
        ends = param.choices if param.type == "categorical" else (param.low, param.high)
        points += [(param.path, {param.path: v}) for v in ends or ()]
    for name, point in points:
        why = why_unpackable(spec.run_config(point, exp.seeds[0]))
        if why is not None:
            where = f" (search.params.{name})" if name else ""
            raise ConfigError(
                f"--cells-per-worker {k}: the search's runs cannot pack{where}: {why}"
            )


def pack_memory(cfg: RunConfig) -> tuple[int, int]:
    """(bytes the shared base holds, bytes each trial adds) for packed runs of ``cfg``: lower
    bounds in float32, as ``harness.config.resources`` counts a run (activations not counted).

        base  = P x 4                       the frozen weights, once per pack
        trial = A x 4 x 4 (+ P' x 4 x 4)    the trial's adapters, their gradients and AdamW's
                                            two moments (+ the critic's trained trunk copy)

    P: the model's parameters, A: the adapters' (rank r on each targeted layer: r x (in + out)),
    P': the trunk's (the model less its output layer), only with ``critic.enabled``."""
    from harness.config.resources import BYTES_PER_PARAM, FULL_FINETUNE_COPIES  # noqa: PLC0415 - loads torch
    from harness.model.lora import model_modules  # noqa: PLC0415 - loads torch

    modules = model_modules(
        cfg.model, tiny=cfg.tiny, trust_remote_code=cfg.model_options.trust_remote_code
    )
    root = modules[""]
    params = sum(p.numel() for p in root.parameters())
    lora = cfg.model_options.lora
    adapter = 0
    if lora is not None:
        targets = list(lora.target_modules)
        for name, module in modules.items():
            if _adapted(name, module, targets):
                weight = module.weight
                adapter += lora.r * (int(weight.shape[0]) + int(weight.shape[1]))
    per_trial = adapter * BYTES_PER_PARAM * FULL_FINETUNE_COPIES
    if cfg.critic.enabled:
        head = getattr(root, "lm_head", None)
        trunk = params - (head.weight.numel() if head is not None else 0)
        per_trial += trunk * BYTES_PER_PARAM * FULL_FINETUNE_COPIES
    return params * BYTES_PER_PARAM, per_trial


def _adapted(name: str, module: Any, targets: list[str]) -> bool:
    """Whether LoRA adapts ``module`` (peft's rule: the full name or its last components; with
    ``all-linear`` every linear layer but the output one)."""
    weight = getattr(module, "weight", None)
    if not name or weight is None or getattr(weight, "ndim", 0) != 2:
        return False
    if targets == ["all-linear"]:
        return type(module).__name__ == "Linear" and name.rsplit(".", 1)[-1] != "lm_head"
    return any(name == t or name.endswith("." + t) for t in targets)


def _size(n: float) -> str:
    if n >= 1e8:
        return f"{n / 1e9:,.2f} GB"
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def plan_lines(
    exp: ExperimentSpec,
    plan: PackPlan,
    memory: Callable[[RunConfig], tuple[int, int]] = pack_memory,
) -> list[str]:
    """What the dry run says of packing: which cells share a worker (per seed), which run alone
    and why, what keeps compatible sets apart, and the memory of the largest pack against the
    same trials unpacked."""
    k = plan.k
    n_seeds = len(exp.seeds)
    lines = [
        f"packing: up to {k} cells per worker (trials of one seed whose base fields agree): "
        f"{len(exp.cells) * n_seeds} trials in {len(plan.groups) * n_seeds} packs or lone runs "
        f"({len(plan.groups)} per seed)"
    ]
    for pack in plan.packs:
        what = "share a worker" if len(pack) > 1 else "runs alone (no compatible cell left)"
        lines.append(f"  {' + '.join(pack)}: {what}")
    for cell, why in plan.alone.items():
        lines.append(f"  {cell}: runs alone ({why})")
    for cells, vs, differs in plan.apart:
        lines.append(f"  {', '.join(cells)}: packs apart from {vs} (they differ in {differs})")
    biggest = max(plan.packs, key=len, default=None)
    if biggest:
        spec = StudySpec.from_experiment(exp)
        cfg = spec.cell_config(biggest[0], exp.seeds[0])
        base, trial = memory(cfg)
        n = len(biggest)
        lines.append(
            f"memory of a pack of {n} (lower bound: float32 weights, adapters with their AdamW "
            f"state; activations not counted): {_size(base)} base + {n} x {_size(trial)} = "
            f"{_size(base + n * trial)} in one worker; unpacked, the same {n} trials hold "
            f"{_size(n * (base + trial))} in {n} workers"
        )
    return lines
