"""A grid's cells share one prompt probe per distinct prompt setting while the file is
validated, and no probe outlives that validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import harness.config.prompt_probe as prompt_probe
from harness.config import ConfigError
from harness.config.experiment import load_experiment
from harness.config.probe_scope import shared_probe_cache


def _write(tmp_path: Path, grid: dict[str, Any], name: str = "e") -> Path:
    doc = {"name": name, "base": {"task": "reverse"}, "grid": grid, "seeds": 1, "steps": 2}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = prompt_probe._probe_prompts

    def counting(cfg: Any, task: Any, tokenizer: Any) -> Any:
        seen.append(f"{cfg.task}:{cfg.rollout.max_prompt_tokens}")
        return real(cfg, task, tokenizer)

    monkeypatch.setattr(prompt_probe, "_probe_prompts", counting)
    return seen


def test_cells_that_differ_elsewhere_share_one_probe(tmp_path: Path, calls: list[str]) -> None:
    spec = load_experiment(
        _write(tmp_path, {"ppo.eps_clip": [0.1, 0.2, 0.3], "optim.lr": [1e-4, 2e-4]})
    )
    assert len(spec.cells) == 6
    assert calls == ["reverse:None"]


def test_each_distinct_prompt_setting_is_probed(tmp_path: Path, calls: list[str]) -> None:
    grid = {"task": ["reverse", "add"], "rollout.max_prompt_tokens": [4, 64]}
    load_experiment(_write(tmp_path, grid))
    # Each axis value is checked alone on the base: the base, the other task, both truncations.
    assert sorted(calls) == ["add:None", "reverse:4", "reverse:64", "reverse:None"]


def test_no_probe_outlives_the_file(tmp_path: Path, calls: list[str]) -> None:
    path = _write(tmp_path, {"ppo.eps_clip": [0.1, 0.2]})
    load_experiment(path)
    load_experiment(path)
    assert calls == ["reverse:None", "reverse:None"]  # the second load probes again
    assert shared_probe_cache() is None


def test_a_cell_with_a_broken_chat_template_is_still_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jinja"
    broken.write_text("{{ messages[0]['content'] | no_such_filter }}")
    path = _write(
        tmp_path, {"ppo.eps_clip": [0.1, 0.2], "rollout.chat_template": ["none", str(broken)]}
    )
    with pytest.raises(ConfigError, match="chat_template"):
        load_experiment(path)
