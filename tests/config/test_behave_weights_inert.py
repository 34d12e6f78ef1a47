"""Settings that once leaked from the `decoupled` variant into the `naive` cells
(behave_imp_weight_mode=token_mask, cap 5) could change nothing with the decoupled loss off:
without it the loop sets old = prox = behaviour log-probs, so every behaviour weight is exp(0) =
1.  They are now refused up front; the control shows they do act under the decoupled loss.
"""

import pytest

from harness.config import build_run_config
from harness.core.configtools import ConfigError
from harness.run.loop import run
from tests.support.tiny import TINY

BASE = {
    "steps": 4,
    "task": "reverse",
    "tiny": TINY,
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 5, "staleness": 2},
    "ppo": {"ppo_n_minibatches": 2, "use_decoupled_loss": False},
    "eval": {"every": 2, "n_prompts": 4},
    "threads": 1,
}
LEAKED = {"ppo.behave_imp_weight_mode": "token_mask", "ppo.behave_imp_weight_cap": 5.0}


def test_leaked_behaviour_weight_settings_are_refused_without_decoupled_loss():
    with pytest.raises(ConfigError, match="behave_imp_weight_mode: 'token_mask' acts only with "):
        build_run_config(BASE, LEAKED)
    with pytest.raises(ConfigError, match="rejection_sampling: acts only with use_decoupled_loss"):
        build_run_config(BASE, {"ppo.rejection_sampling": {"upper": 2.0}})


def test_the_same_settings_do_change_the_decoupled_loss(tmp_path):
    """Control: with the decoupled loss on (and stale data) the weights are not all 1, so the
    test above would notice if they were applied."""
    on = {**LEAKED, "ppo.use_decoupled_loss": True}
    res = run(build_run_config(BASE, on), results_dir=tmp_path)
    w = res.history["policy/behave_weight_min"] + res.history["policy/behave_weight_max"]
    assert any(v != 1.0 for v in w[1:])
