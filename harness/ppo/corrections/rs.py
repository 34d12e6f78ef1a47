"""Rejection filters: the token or the whole row leaves the loss, no weight."""

from __future__ import annotations

import math

from harness.ppo.corrections.registry import Preset, preset, row_filter
from harness.ppo.corrections.spec import Correction

preset(
    Preset(
        "geo_mask",
        "geometric sequence mask: rows whose geometric-mean ratio leaves [0.99, 1.01] drop out",
        "keep_i ⟺ 0.99 ≤ exp(mean_t M(ℓp − ℓb)) ≤ 1.01",
        Correction(filters=(row_filter("ratio", lower=0.99, upper=1.01),)),
        peers={
            "SkyRL": "`sequence_mask_metric=geometric`, `geo_mask_low=0.99`, `geo_mask_high=1.01`",
        },
        rank=5,
    )
)

preset(
    Preset(
        "geo_rs",
        "Geo-RS: verl's seq_mean_k1 filter, post-filter denominator",
        "keep_i ⟺ log 0.999 ≤ mean_t M(ℓb − ℓp) ≤ log 1.001; dropped rows leave the denominators",
        Correction(
            filters=(row_filter("k1", lower=math.log(0.999), upper=math.log(1.001)),),
            denominator="post",
        ),
        peers={
            "verl": '`rollout_rs=seq_mean_k1`, `rollout_rs_threshold="0.999_1.001"` '
            "(decoupled_geo_rs)",
        },
        rank=6,
    )
)

preset(
    Preset(
        "k3_rs",
        "k3 rejection: rows whose mean k3 KL(π_b‖π_p) exceeds 0.01 drop out",
        "keep_i ⟺ mean_t M(w − 1 − log w) ≤ 0.01; post-filter denominator",
        Correction(filters=(row_filter("k3", upper=0.01),), denominator="post"),
        peers={"verl": "`rollout_rs=seq_mean_k3`, `rollout_rs_threshold=0.01` (decoupled_k3_rs)"},
        rank=7,
    )
)
