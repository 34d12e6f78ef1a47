"""Every cell of every shipped experiment is exactly base + its own overrides (none leaks in).

The reference is computed without the experiment loader: the raw YAML's ``base`` plus the cell's
own settings, built into a ``RunConfig`` on a fresh copy each time.  The loader, the grid hash,
the study payload and the worker's trial config must all agree with it, and reordering the
grid's values and variants must not change what any cell trains with.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.config import (
    apply_overrides,
    build_run_config,
    expand_aliases,
    resolve_alias,
)
from harness.config.experiment import load_experiment
from harness.core.configtools import deep_merge, flatten, to_dict
from harness.sweep.scheduler.spec import StudySpec
from tests.support.extras import usable_here

ROOT = Path(__file__).resolve().parents[3]
GRID_FILES = sorted(
    p
    for p in [*ROOT.glob("experiments/*.yaml"), *ROOT.glob("experiments/findings/*.yaml")]
    if "grid" in (yaml.safe_load(p.read_text()) or {}) and usable_here(p)
)


def _raw(path: Path) -> dict[str, Any]:
    raw = yaml.safe_load(path.read_text())
    base = raw.get("base", {})
    if isinstance(base, str):
        base = yaml.safe_load((path.parent / base).read_text())
    raw["base"] = base
    return raw


def _reference(raw: dict[str, Any], choice: dict[str, Any], seed: int, steps: int) -> dict:
    """Base + this cell's own settings, from the raw file, sharing nothing with other cells."""
    data = expand_aliases(copy.deepcopy(raw["base"]))
    for axis, value in choice.items():
        if axis == "variant":
            for k, v in raw["grid"]["variant"][value].items():
                data = apply_overrides(data, {resolve_alias(k): v})
        else:
            data = apply_overrides(data, {axis: value})
    data = apply_overrides(data, {"seed": seed, "steps": steps})
    return to_dict(build_run_config(data))


def test_shipped_grid_files_found() -> None:
    names = {p.name for p in GRID_FILES}
    assert {"default.yaml", "decoupled.yaml", "staleness.yaml", "norm.yaml"} <= names


@pytest.mark.parametrize("path", GRID_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cell_is_base_plus_its_own_overrides(path: Path) -> None:
    raw = _raw(path)
    spec = load_experiment(path)
    # Loading validates every cell; the base it keeps is the file's base, untouched.
    assert spec.base == expand_aliases(raw["base"])
    study_spec = StudySpec.from_experiment(spec)
    payload_base = dict(study_spec.base)
    assert payload_base == to_dict(build_run_config(expand_aliases(raw["base"])))
    # What a worker builds: from the spec as stored on the study (JSON round trip).
    stored_spec = StudySpec.from_json(study_spec.to_json())
    assert stored_spec == study_spec
    for cell in spec.cells:
        want = _reference(raw, cell.choice, seed=3, steps=spec.steps)
        got = to_dict(study_spec.cell_config(cell.label, 3))
        assert got == want, cell.label
        assert to_dict(stored_spec.cell_config(cell.label, 3)) == want, cell.label
        # Building a cell leaves the spec untouched (configs are built on deep copies).
        assert dict(stored_spec.base) == payload_base, cell.label
        # Differs from the base only in keys the cell names (and seed/steps).
        diff = {
            k
            for k, v in flatten(want).items()
            if flatten(payload_base).get(k, object()) != v and k not in ("seed", "steps")
        }
        named = {resolve_alias(k) for k in cell.overrides}
        assert all(any(k == n or k.startswith(n + ".") for n in named) for k in diff), (
            cell.label,
            diff - named,
        )
    # The resolved payload base never carries a value only some cells set.
    assert spec.base == expand_aliases(raw["base"])


@pytest.mark.parametrize("path", GRID_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cell_configs_do_not_depend_on_cell_order(path: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    if isinstance(raw.get("base"), str):
        raw["base"] = str((path.parent / raw["base"]).resolve())
    reordered = copy.deepcopy(raw)
    grid = reordered["grid"]
    reordered["grid"] = {
        axis: (
            dict(reversed(list(values.items()))) if axis == "variant" else list(reversed(values))
        )
        for axis, values in reversed(list(grid.items()))
    }
    other = tmp_path / path.name
    other.write_text(yaml.safe_dump(reordered, sort_keys=False))
    a = load_experiment(path)
    b = load_experiment(other)
    by_choice = {tuple(sorted(c.choice.items(), key=str)): c for c in b.cells}
    assert len(by_choice) == len(a.cells)
    for cell in a.cells:
        twin = by_choice[tuple(sorted(cell.choice.items(), key=str))]
        sa, sb = StudySpec.from_experiment(a), StudySpec.from_experiment(b)
        assert to_dict(sa.cell_config(cell.label, 0)) == to_dict(sb.cell_config(twin.label, 0))
    assert a.base == b.base


def test_loader_and_mergers_never_mutate_inputs() -> None:
    base = {"ppo": {"eps_clip": 0.2, "adv_norm": {"mean_level": "batch"}}, "rollout": {}}
    frozen = copy.deepcopy(base)
    out = apply_overrides(base, {"ppo.c_clip": 3.0, "ppo.adv_norm.std_level": "batch"})
    out["ppo"]["adv_norm"]["mean_level"] = "group"
    merged = deep_merge(base, {"ppo": {"eps_clip": 0.3}})
    merged["ppo"]["adv_norm"]["eps"] = 1.0
    expand_aliases({"adv_norm": base["ppo"]["adv_norm"]})["ppo"]["adv_norm"]["x"] = 1
    assert base == frozen


def test_variant_key_does_not_leak_into_sibling_cells(tmp_path: Path) -> None:
    """The measured leak: a decoupled variant's behaviour-weight settings reached naive cells."""
    f = tmp_path / "leak.yaml"
    f.write_text(
        "name: leak\nbase: {task: reverse}\ngrid:\n  variant:\n"
        "    naive: {ppo.use_decoupled_loss: false}\n"
        "    decoupled: {ppo.use_decoupled_loss: true, ppo.behave_imp_weight_mode: token_mask,"
        " ppo.behave_imp_weight_cap: 5.0}\nsteps: 2\n"
    )
    spec = load_experiment(f)
    naive = next(c for c in spec.cells if c.label.endswith("naive"))
    cfg = StudySpec.from_experiment(spec).cell_config(naive.label, 0)
    assert cfg.ppo.behave_imp_weight_mode == "disabled"
    assert cfg.ppo.behave_imp_weight_cap is None
    assert "behave_imp_weight_mode" not in spec.base.get("ppo", {})
