"""A config built in Python is checked against its field declarations exactly as one read from a
file: the same machinery (``configtools.checked``), the same one-line wording."""

import dataclasses
import math

import pytest

from harness.core.configtools import ConfigError, from_dict
from harness.ppo.config import PPOActorConfig
from harness.ppo.corrections.areal import RejectionSampling, legacy_to_rejection_sampling
from harness.ppo.corrections.spec import Correction, Filter
from harness.ppo.normalization import NormConfig
from harness.ppo.objectives.dppo import DPPOOptions
from harness.ppo.objectives.loss_options import ClipOptions
from harness.ppo.objectives.vespo import VESPOOptions

CASES = [
    (PPOActorConfig, {"eps_clip": -1}, "eps_clip: must be a finite number > 0; got -1.0"),
    (PPOActorConfig, {"behave_imp_weight_cap": 1.0}, "behave_imp_weight_cap: must be a finite number > 1; got 1.0"),
    (PPOActorConfig, {"loss_agg_mode": "sum"}, "loss_agg_mode: must be one of 'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum', 'seq-mean-token-sum-norm', 'prompt-mean'; got 'sum'"),
    (PPOActorConfig, {"ppo_epochs": True}, "ppo_epochs: must be an integer; got True"),
    (ClipOptions, {"c_clip": 1.0}, "c_clip: must be a finite number > 1; got 1.0"),
    (NormConfig, {"mean_level": "x"}, "mean_level: must be one of 'batch', 'group' or null; got 'x'"),
    (NormConfig, {"eps": math.nan}, "eps: must be a finite number >= 0; got nan"),
    (NormConfig, {"group_size": 0}, "group_size: must be an integer in [1, 10_000]; got 0"),
    (NormConfig, {"std_unbiased": 1}, "std_unbiased: must be true or false; got 1"),
    (RejectionSampling, {"metric": "kl"}, "rejection_sampling.metric: must be one of 'ratio', 'kl_k1', 'kl_k2', 'kl_k3', 'binary_kl'; got 'kl'"),
    (DPPOOptions, {"anchor": "x"}, "dppo.anchor: must be one of 'behaviour', 'proximal'; got 'x'"),
    (VESPOOptions, {"behaviour_weight": "x"}, "vespo.behaviour_weight: must be one of 'multiply', 'fold'; got 'x'"),
    (Filter, {"direction": "x", "upper": 1.0}, "filters[].direction: must be one of 'behave_ref', 'ref_behave'; got 'x'"),
    (Correction, {"weight": "w"}, "weight: must be one of 'none', 'token', 'sequence_product', 'sequence_geometric'; got 'w'"),
]  # fmt: skip


@pytest.mark.parametrize("cls,kw,msg", CASES, ids=lambda x: getattr(x, "__name__", None))
def test_python_construction_checks_the_declarations(cls, kw, msg):
    with pytest.raises(ValueError) as err:
        cls(**kw)
    assert str(err.value) == msg
    # The file path says the same (from_dict checks before the constructor runs).
    with pytest.raises(ConfigError) as from_file:
        from_dict(cls, kw)
    assert msg.endswith(str(from_file.value))


def test_replace_is_checked_too():
    with pytest.raises(ValueError, match="^divide_by: must be one of 'std', 'mean'; got 'x'$"):
        dataclasses.replace(NormConfig(), divide_by="x")


def test_cross_field_rules_still_follow_the_field_checks():
    with pytest.raises(ValueError, match="requires metric 'ratio'"):
        RejectionSampling(action="clamp", metric="kl_k3", upper=1.0)
    with pytest.raises(ValueError, match="dppo.ratio_cap means nothing"):
        DPPOOptions(ratio_cap=2.0)


def test_legacy_mode_without_a_cap_is_an_infinite_bound():
    rs = legacy_to_rejection_sampling("token_mask", None)
    assert rs is not None and rs.upper == math.inf and rs.action == "mask"
