"""AReaL's admission rule and the lag statistics (harness/sampling/admission.py), and the sampler side
of asynchronous rollouts scheduled on a virtual clock against a scripted step sampler: the lag
bound holds whatever the sequence lengths, update time, η and batch."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config import build_run_config
from harness.run.async_rollouts import _SamplerSide
from harness.sampling.admission import capacity, lag_stats, over_sampled
from harness.sampling.stepping import Finished, StepSampler


def test_capacity_golden():
    # (η + v + 1)·B − (accepted + running): η 2, v 0, B 4 → 12 at the start
    assert capacity(accepted=0, running=0, version=0, max_staleness=2, batch=4) == 12
    assert capacity(accepted=4, running=8, version=0, max_staleness=2, batch=4) == 0
    assert capacity(accepted=4, running=8, version=1, max_staleness=2, batch=4) == 4
    # max_concurrent bounds what runs at once
    assert (
        capacity(accepted=0, running=3, version=0, max_staleness=2, batch=4, max_concurrent=5) == 2
    )
    # partial rollouts' extra groups, and never negative
    assert capacity(accepted=0, running=0, version=0, max_staleness=0, batch=4, extra=4) == 8
    assert capacity(accepted=20, running=0, version=0, max_staleness=0, batch=4) == 0
    assert over_sampled(1.0, 8) == 0 and over_sampled(1.5, 8) == 4 and over_sampled(1.3, 8) == 3


def test_lag_stats_golden():
    versions = torch.tensor([[-1, 3, 3, 4], [-1, 4, 4, -1], [-1, 2, -1, -1]])
    mask = versions >= 0
    out = lag_stats(versions, mask, learner_version=4)
    # lags 1 1 0 | 0 0 | 2 → mean 4/6, max 2; rows spanning two versions: row 0 of 3
    assert out["async/token_lag_mean"] == pytest.approx(4 / 6)
    assert out["async/token_lag_max"] == 2.0
    assert out["async/mixed_version_fraction"] == pytest.approx(1 / 3)
    empty = lag_stats(versions, torch.zeros_like(mask), learner_version=4)
    assert set(empty.values()) == {0.0}


class Scripted(StepSampler):
    """Group g runs ``lengths[g % len(lengths)]`` decode steps; records the versions it ran at."""

    def __init__(self, lengths: list[int]) -> None:
        super().__init__()
        self.lengths = lengths
        self.left: dict[int, int] = {}
        self.seen: dict[int, set[int]] = {}
        self.submitted: dict[int, int] = {}

    def load(self, state, version, *, recompute):
        self.version = version

    def submit(self, prompts, gids):
        for g in gids:
            self.left[g] = self.lengths[g % len(self.lengths)]
            self.seen[g] = set()
            self.submitted[g] = self.version

    def step(self):
        done = []
        for g in sorted(self.left):
            self.seen[g].add(self.version)
            self.left[g] -= 1
            if self.left[g] == 0:
                del self.left[g]
                done.append(Finished(g, None, self.submitted[g]))  # type: ignore[arg-type]
        self.decode_steps += 1
        return done

    @property
    def running(self):
        return len(self.left)


class Task:
    def sample(self, rng, n):
        return [SimpleNamespace(prompt=f"p{rng.random()}") for _ in range(n)]


def simulate(eta, batch, lengths, update_time, steps, **extra):
    """The virtual clock's schedule (VirtualRollouts.collect) over a scripted sampler: the
    learner takes a batch when free and ready, its update lands update_time steps later.
    Returns, per consumed group, (learner version at the take, versions its tokens came from)."""
    over = {"rollout.async.max_staleness": eta, "rollout.prompts_per_step": batch, **extra}
    cfg = build_run_config({}, [f"{k}={v}" for k, v in over.items()])
    stepper = Scripted(lengths)
    side = _SamplerSide(SimpleNamespace(cfg=cfg, task=Task()), stepper, trainable_only=False)
    side.publish({}, 0)
    consumed, t, publish_at, version = [], 0, None, 0
    while len(consumed) < steps * batch:
        if publish_at is not None and t >= publish_at:
            version += 1
            side.publish({}, version)
            publish_at = None
        if publish_at is None and side.ready():
            groups, _ = side.take()
            consumed += [(version, stepper.seen[g.gid]) for g in groups]
            publish_at = t + update_time
        side.tick()
        t += 1
        assert t < 100_000
    return consumed


@settings(max_examples=60, deadline=None)
@given(
    eta=st.integers(0, 4),
    batch=st.integers(1, 5),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    update_time=st.integers(1, 12),
    in_flight=st.booleans(),
)
def test_no_token_lags_more_than_eta(eta, batch, lengths, update_time, in_flight):
    extra = {"rollout.async.weight_updates": "in_flight"} if in_flight and eta else {}
    consumed = simulate(eta, batch, lengths, update_time, steps=12, **extra)
    lags = [v - u for v, seen in consumed for u in seen]
    assert max(lags) <= eta and min(lags) >= 0
    if eta == 0:  # synchronous: every token of the current version
        assert set(lags) == {0}


def test_in_flight_updates_mix_versions_and_between_batches_never_does():
    kw = dict(eta=2, batch=2, lengths=[7, 3, 9, 5], update_time=4, steps=10)
    mixed = simulate(**kw, **{"rollout.async.weight_updates": "in_flight"})
    plain = simulate(**kw)
    assert any(len(seen) > 1 for _, seen in mixed)
    assert all(len(seen) == 1 for _, seen in plain)


def test_partial_rollouts_take_the_first_finished_and_continue_the_rest():
    # Groups alternate long (9) and short (2): without partial a step waits for its oldest
    # groups; with partial (over_sample 2) it takes the short ones first and the long ones
    # carry on into later steps.
    kw = dict(eta=0, batch=2, lengths=[9, 2], update_time=3, steps=6)
    fifo = simulate(**kw)
    part = simulate(**kw, **{"rollout.async.partial": "true", "rollout.async.over_sample": 2})
    assert len(fifo) == len(part) == 12
    assert all(v == min(seen) for v, seen in fifo)  # η 0: lag 0 throughout
    assert max(v - min(seen) for v, seen in part) >= 1  # carried over: older than the learner
