"""The statistics each objective logs beyond the ones every objective logs
(``policy/silenced_frac``, ``policy/reweighted_frac``), written out by hand: the tests check the
logged keys against this list, not against the objectives' own declarations."""

OWN_STATS = {
    "ppo": set(),
    "cispo": {"policy/gate_mean"},
    "sapo": {"policy/gate_mean"},
    "gmpo": {"policy/gate_mean"},
    "clip_cov": {"policy/cov_selected", "policy/cov_candidates", "policy/cov_threshold"},
    "kl_cov": {"policy/cov_selected", "policy/cov_threshold", "policy/cov_penalty_kl"},
    "dppo": set(),
}
