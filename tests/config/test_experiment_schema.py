"""Experiment files go through the declared schema (configtools.from_dict), like run configs:
one SearchParam from file to study, bounds written once, one-line errors naming the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import pytest
import yaml

from harness.config.experiment import load_experiment
from harness.config.experiment_schema import ExperimentFile, SearchFile, SearchParam
from harness.core.configtools import BadValue, ConfigError, from_dict
from harness.core.fields import field_help, meta
from harness.model.options import LoraOptions, TinyModelConfig
from harness.sweep.scheduler import spec as sweep_spec

BASE = {
    "task": "reverse",
    "tiny": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 4},
    "eval": {"every": 0, "n_prompts": 4},
}
SEARCH = {
    "n_trials": 3,
    "params": {"ppo.eps_clip": {"type": "float", "low": 0.1, "high": 0.3}},
}


def write(tmp_path: Path, **doc: Any) -> Path:
    body = {"name": "schema", "base": BASE, "steps": 2, **doc}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in body.items() if v is not None}))
    return path


def error(tmp_path: Path, **doc: Any) -> str:
    path = write(tmp_path, **doc)
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    return msg[len(f"{path}: ") :]


def test_one_search_param_class_from_file_to_study(tmp_path: Path) -> None:
    assert sweep_spec.SearchParam is SearchParam  # no field-by-field copy between the layers
    spec = load_experiment(write(tmp_path, search={**SEARCH, "pruner": "none"}))
    assert spec.search is not None
    (param,) = spec.search.params
    assert param == SearchParam(type="float", path="ppo.eps_clip", low=0.1, high=0.3)
    study = sweep_spec.StudySpec.from_experiment(spec)
    assert study.search is spec.search
    back = sweep_spec.StudySpec.from_json(study.to_json())
    assert back.search == spec.search and back.search.params[0].path == "ppo.eps_clip"


def test_search_param_alias_and_int_range_keep_their_types(tmp_path: Path) -> None:
    params = {
        "adv_norm.mean_level": {"type": "categorical", "choices": ["batch", "group"]},
        "rollout.staleness": {"type": "int", "low": 0, "high": 4, "step": 2},
    }
    spec = load_experiment(write(tmp_path, search={"n_trials": 2, "params": params}))
    assert spec.search is not None
    cat, rng = spec.search.params
    assert (cat.path, cat.choices) == ("ppo.adv_norm.mean_level", ("batch", "group"))
    # int ends stay ints: the study's grid hash is computed from them
    assert (rng.low, rng.high, rng.step) == (0, 4, 2) and isinstance(rng.low, int)


@pytest.mark.parametrize(
    ("doc", "expect"),
    [
        ({"seeds": []}, "seeds: must be a count >= 1 or a non-empty list of integers"),
        ({"seeds": [1, 1]}, "seeds: duplicate seeds in [1, 1]"),
        ({"seeds": True}, "seeds: must be an integer or a list or a mapping; got True"),
        ({"description": 3}, "description: must be a string; got 3"),
        ({"grid": None, "search": {"params": SEARCH["params"]}}, "search.n_trials: missing"),
        (
            {"grid": None, "search": {**SEARCH, "n_trials": 0}},
            "search.n_trials: must be an integer in [1, 100_000]; got 0",
        ),
        (
            {"grid": None, "search": {**SEARCH, "params": {"optim.lr": {"low": 1, "high": 2}}}},
            "search.params.optim.lr.type: missing (must be one of 'float', 'int', 'categorical')",
        ),
        (
            {"grid": None, "search": {**SEARCH, "params": {"optim.lr": {"type": "float"}}}},
            "search.params.optim.lr.low: must be a number below high; got low=None, high=None",
        ),
        (
            {
                "grid": None,
                "search": {**SEARCH, "params": {"optim.lr": {"type": "float", "path": "x"}}},
            },
            "search.params.optim.lr.path: unknown key (allowed: choices, high, log, low, step, "
            "type)",
        ),
        (
            {"grid": None, "search": {**SEARCH, "pruner": "hyperband"}},
            "search.pruner: must be one of 'median', 'wilcoxon', 'none'; got 'hyperband'",
        ),
        (
            {
                "grid": None,
                "search": {**SEARCH, "objectives": [{"metric": "final/reward", "x": 1}]},
            },
            "search.objectives[0].x: unknown key (allowed: direction, metric)",
        ),
        (
            {"grid": None, "search": {**SEARCH, "objectives": [{"direction": "up"}]}},
            "search.objectives[0].direction: must be one of 'maximize', 'minimize'; got 'up'",
        ),
        (
            {"grid": None, "search": {**SEARCH, "sampler_seed": -1}},
            "search.sampler_seed: must be an integer in [0, 4_294_967_295]; got -1",
        ),
        ({"grid": {3: [1]}}, "grid: keys must be strings; got 3"),
        (  # an alias is named as written, once
            {
                "grid": None,
                "search": {
                    "n_trials": 2,
                    "params": {"adv_norm.mean_level": {"type": "categorical", "choices": ["x"]}},
                },
            },
            "search.params.adv_norm.mean_level: value 'x' rejected: must be one of 'batch', "
            "'group' or null; got 'x'",
        ),
        (
            {"grid": None, "search": SEARCH, "baseline": "x"},
            "baseline: only applies to grids",
        ),
    ],
)
def test_declared_schema_errors_name_the_key(tmp_path: Path, doc: dict, expect: str) -> None:
    doc = {"grid": {"ppo.eps_clip": [0.1, 0.2]}, **doc}
    assert expect in error(tmp_path, **doc)


def test_every_experiment_field_declares_help() -> None:
    for cls in (ExperimentFile, SearchFile, SearchParam):
        helps = field_help(cls)
        assert helps and all(helps.values()), (cls.__name__, helps)


def test_annotated_items_declare_their_own_range() -> None:
    @dataclasses.dataclass
    class Doc:
        ids: list[Annotated[int, meta("An id.", ge=0, le=9)]] = dataclasses.field(
            default_factory=list, metadata=meta("Ids.")
        )

    assert from_dict(Doc, {"ids": [0, 9]}).ids == [0, 9]
    with pytest.raises(BadValue, match=r"^ids\[1\]: must be an integer in \[0, 9\]; got 10$"):
        from_dict(Doc, {"ids": [0, 10]})


def test_model_option_bounds_are_declared_not_repeated_in_post_init() -> None:
    """The declared range refuses a value from a file; __post_init__ keeps the cross-field check."""
    with pytest.raises(ConfigError, match=r"^tiny\.hidden_size: must be an integer in \[1, "):
        from_dict(TinyModelConfig, {"hidden_size": 0}, "tiny")
    with pytest.raises(ConfigError, match=r"^lora\.dropout: must be a finite number in \[0, 1\)"):
        from_dict(LoraOptions, {"dropout": 1.0}, "lora")
    with pytest.raises(ConfigError, match="must be divisible by tiny.num_heads"):
        from_dict(TinyModelConfig, {"hidden_size": 130, "num_heads": 4}, "tiny")


def test_a_baseline_matching_several_cells_names_only_those_cells(tmp_path):
    grid = {"ppo.eps_clip": [0.1, 0.2], "ppo.kl_ctl": [0.0, 0.01]}
    msg = error(tmp_path, grid=grid, baseline={"ppo.eps_clip": 0.2})
    assert "matches several cells (matching cells: " in msg
    assert "eps_clip=0.2" in msg and "eps_clip=0.1" not in msg
    missing = error(tmp_path, grid=grid, baseline={"ppo.eps_clip": 0.3})
    assert "is not a cell of the grid (cells: " in missing and "eps_clip=0.1" in missing
