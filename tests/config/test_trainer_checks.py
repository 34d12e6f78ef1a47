"""What a trainer cannot express reaches the config layer through its registry
(``harness.config.trainer_checks``): ``harness.peers.trl`` registers TRL's limits, the config is
refused when it is built, and ``train`` refuses a config built around the registry."""

from __future__ import annotations

import pytest

from harness.config import ConfigError, RunConfig, build_run_config
from harness.config.trainer_checks import check_trainer, refusal, register_trainer_check
from harness.run import trainers

REWARD_NORM = "ppo.reward_norm: not expressible with trainer: trl (TRL always centres rewards"


def test_the_schema_names_no_peer_and_the_registered_check_refuses_on_build() -> None:
    # RunConfig alone knows nothing of TRL: the dataclass builds (its default reward_norm is
    # null, which TRL cannot express)
    cfg = RunConfig(trainer="trl")
    assert cfg.trainer == "trl" and cfg.ppo.reward_norm is None
    with pytest.raises(ConfigError) as err:
        build_run_config({"trainer": "trl"})  # harness.peers.trl is loaded: its check applies
    assert str(err.value).startswith(REWARD_NORM)
    with pytest.raises(ConfigError) as again:
        check_trainer(cfg)
    assert str(again.value) == str(err.value)
    build_run_config({"trainer": "harness"})  # the harness's own trainer has no such limits


def test_train_refuses_before_any_trainer_is_chosen(monkeypatch) -> None:
    def no_trainer(name: str):
        raise AssertionError(f"trainer {name!r} chosen for a config it cannot express")

    monkeypatch.setattr(trainers, "get_trainer", no_trainer)
    with pytest.raises(ConfigError) as err:
        trainers.train(RunConfig(trainer="trl"))
    assert str(err.value).startswith(REWARD_NORM)


def test_every_problem_in_one_line_the_first_field_leading() -> None:
    line = refusal("trl", [("ppo.kl_ctl", "use 0"), ("rollout.n_samples", "at least 2")])
    assert line == (
        "ppo.kl_ctl: not expressible with trainer: trl (use 0); also rollout.n_samples: at least 2"
    )


def test_only_a_known_trainer_takes_a_check() -> None:
    with pytest.raises(ValueError, match=r"no trainer 'verl' \(trainers: harness, trl\)"):
        register_trainer_check("verl", lambda cfg: [])
