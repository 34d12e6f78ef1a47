"""The loop loads the sampling weights once per step: dynamic sampling's refill rounds sample
what the step loaded, and steps sampling the same stale snapshot share one copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.config import build_run_config
from harness.run.loop import run
from harness.sampling.local import LocalSampler
from tests.support.tiny import TINY


def _count(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    seen: dict[str, list[Any]] = {"syncs": [], "rounds": []}
    real_sync, real_gen = LocalSampler._sync, LocalSampler._generate

    def sync(self: LocalSampler, weights: Any) -> float:
        seen["syncs"].append(self.version)
        return real_sync(self, weights)

    def gen(self: LocalSampler, *args: Any, **kw: Any) -> Any:
        seen["rounds"].append(self.version)
        return real_gen(self, *args, **kw)

    monkeypatch.setattr(LocalSampler, "_sync", sync)
    monkeypatch.setattr(LocalSampler, "_generate", gen)
    return seen


def _cfg(**over: Any) -> Any:
    base = {
        "steps": 4,
        "task": "reverse",
        "tiny": TINY,
        "rollout": {"prompts_per_step": 2, "n_samples": 4, "max_new_tokens": 5},
        "ppo": {"ppo_n_minibatches": 2},
        "eval": {"every": 0, "n_prompts": 2},
        "threads": 1,
    }
    return build_run_config(base, over)


def test_refill_rounds_reuse_the_steps_weights(tmp_path: Path, monkeypatch) -> None:
    seen = _count(monkeypatch)
    c = _cfg(**{"rollout.zero_variance_filter": True, "rollout.max_resample_rounds": 3})
    res = run(c, results_dir=tmp_path)
    assert res.steps_done == 4
    # Some step sampled more than one round (the untrained policy's groups are mostly
    # zero-variance) ...
    assert sum(res.history["rollout/resample_rounds"]) == len(seen["rounds"]) - 4 > 0
    # ... yet there is one copy per version sampled: a step copies when an update moved the
    # weights (a step whose every group was dropped takes no update, so the next step reuses
    # its weights), and its refill rounds never copy.
    versions = sorted(set(seen["rounds"]))
    assert len(seen["syncs"]) == len(versions) < len(seen["rounds"])
    assert seen["syncs"] == [None, *versions[:-1]]  # each copy replaced the version before


def test_steps_sampling_one_stale_snapshot_share_one_copy(tmp_path: Path, monkeypatch) -> None:
    seen = _count(monkeypatch)
    res = run(_cfg(**{"rollout.staleness": 2}), results_dir=tmp_path)
    assert res.steps_done == 4
    # Steps 0, 1 and 2 sample version 0 (the ring fills), step 3 version 1: two copies.
    assert seen["rounds"] == [0, 0, 0, 1]
    assert len(seen["syncs"]) == 2
