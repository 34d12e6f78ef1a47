"""Settings that once leaked from the `decoupled` variant into the `naive` cells
(behave_imp_weight_mode=token_mask, cap 5) change nothing when the decoupled loss is off.

Why they should not: without the decoupled loss the loop sets old = prox = behaviour log-probs,
so every behaviour weight is exp(0) = 1 exactly and the token_mask cap of 5 never binds.  This
checks it end to end on stale rollouts (two runs in one process, so exact equality is fair).
"""

import json

from harness.config import build_run_config
from harness.run.loop import run

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
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


def test_leaked_behaviour_weight_settings_are_inert_without_decoupled_loss(tmp_path):
    clean = run(build_run_config(BASE), results_dir=tmp_path)
    leaked = run(build_run_config(BASE, LEAKED), results_dir=tmp_path)
    assert clean.status == leaked.status == "completed" and clean.steps_done == 4
    shared = [k for k in clean.history if not k.startswith("perf/")]
    assert len(shared) > 20
    for k in shared:
        assert json.dumps(clean.history[k]) == json.dumps(leaked.history[k]), k
    # The weights were computed (and logged) in the leaked run, and were exactly 1 throughout.
    assert leaked.history["policy/behave_weight_min"] == [1.0] * 4
    assert leaked.history["policy/behave_weight_max"] == [1.0] * 4
    assert leaked.history["policy/filtered_fraction"] == [0.0] * 4
    assert "policy/behave_weight_min" not in clean.history


def test_the_same_settings_do_change_the_decoupled_loss(tmp_path):
    """Control: with the decoupled loss on (and stale data) the weights are not all 1, so the
    test above would notice if they were applied."""
    on = {**LEAKED, "ppo.use_decoupled_loss": True}
    res = run(build_run_config(BASE, on), results_dir=tmp_path)
    w = res.history["policy/behave_weight_min"] + res.history["policy/behave_weight_max"]
    assert any(v != 1.0 for v in w[1:])
