"""The stability options: top-entropy mask, truncated completions, overlong penalty, zero-variance
groups (dynamic sampling) and prompt-mean aggregation — golden tiny tensors, properties, config
errors, export, and one short CLI run combining them (docs/ppo-semantics.md "Stability options")."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from harness.cli import app
from harness.config import RunConfig
from harness.core.configtools import from_dict
from harness.metrics import OPTION_METRICS
from harness.peers.export import export_areal, export_trl, export_verl
from harness.ppo import PPOActor
from harness.ppo.config import PPOActorConfig
from harness.ppo.masks import (
    entropy_threshold,
    group_ids_from_sizes,
    prompt_mean,
    top_entropy_mask,
    truncated_row_mask,
)
from harness.ppo.normalization import NormConfig
from harness.ppo.objectives import OBJECTIVES, lookup, ppo_actor_loss
from harness.ppo.shaping import overlong_penalty, zero_variance_groups
from harness.run.dynamic_sampling import Round, concat_rollouts, refill, select_groups
from harness.sampling.base import RolloutBatch
from tests.support.objective_cli import SMALL, assert_trains_through_the_cli
from tests.support.tiny import tiny_reverse

close = torch.testing.assert_close

# ------------------------------------------------------------------ top-entropy mask


def test_top_entropy_mask_golden():
    H = torch.tensor([[0.1, 0.5, 0.9, 0.3], [0.7, 0.2, 9.0, 0.0]])
    m = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    # valid entropies sorted: 0.1 0.2 0.3 0.5 0.7 0.9; q = 0.5 → pos 2.5 → τ = 0.4
    keep = top_entropy_mask(H, m, 0.5)
    assert keep.tolist() == [[False, True, True, False], [True, False, False, False]]
    # ρ = 0 keeps the maximum only, ρ = 1 every valid token, never a padded one (9.0)
    assert top_entropy_mask(H, m, 0.0).tolist() == [[False, False, True, False], [False] * 4]
    assert top_entropy_mask(H, m, 1.0).tolist() == m.tolist()
    assert not top_entropy_mask(H, torch.zeros_like(m), 0.2).any()


def test_top_entropy_ties_at_the_threshold_are_kept():
    H = torch.tensor([[1.0, 1.0, 1.0, 2.0]])
    m = torch.ones_like(H, dtype=torch.bool)
    # τ = quantile(·, 0.5) = 1.0: the three tied tokens stay
    assert top_entropy_mask(H, m, 0.5).tolist() == [[True, True, True, True]]
    assert top_entropy_mask(H, m, 0.2).tolist() == [[False, False, False, True]]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 10, allow_nan=False, width=32), min_size=1, max_size=40),
    st.floats(0, 1),
)
def test_entropy_threshold_is_torch_quantile_and_the_kept_set_is_an_upper_set(values, rho):
    v = torch.tensor(values)
    close(entropy_threshold(v, 1 - rho), torch.quantile(v, 1 - rho), rtol=0, atol=1e-6)
    keep = top_entropy_mask(v[None], torch.ones(1, len(values), dtype=torch.bool), rho)[0]
    assert keep.any()  # the maximum always reaches τ
    if keep.any() and (~keep).any():
        assert v[keep].min() > v[~keep].max()
    # at least the top ρ share of the tokens stays (linear interpolation can only keep more)
    assert int(keep.sum()) >= math.floor(rho * (len(values) - 1)) + 1 - 1e-9


def _actor_loss(cfg, lt, old, adv, mask, H, group_ids=None):
    batch = {"mask": mask, "prox_logprobs": old, "old_logprobs": old, "advantages": adv}
    if group_ids is not None:
        batch["group_ids"] = group_ids
    x = lt.clone().requires_grad_(True)
    loss, stats = PPOActor(cfg).compute_loss(batch, logprobs=x, entropy=H)
    loss.backward()
    return loss.detach(), x.grad, stats


def test_top_entropy_mask_keeps_every_valid_token_in_the_denominator():
    g = torch.Generator().manual_seed(0)
    lt = -torch.rand(3, 5, generator=g) * 3
    old = lt + 0.1 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.rand(3, 5, generator=g) < 0.8
    H = torch.rand(3, 5, generator=g) * 2
    cfg = PPOActorConfig(top_entropy_quantile=0.3)
    loss, grad, stats = _actor_loss(cfg, lt, old, adv, mask, H)
    keep = top_entropy_mask(H, mask, 0.3)
    full, fstats = ppo_actor_loss(lt, old, old, adv, mask)
    # the same per-token losses, the dropped ones zeroed, divided by ALL valid tokens
    want = torch.where(keep, fstats["loss"], torch.zeros(())).sum() / mask.sum()
    close(loss, want)
    assert (grad[mask & ~keep] == 0).all() and (grad[keep] != 0).any()
    assert stats["entropy_mask"].tolist() == keep.tolist()


def test_entropy_masked_frac_metric():
    from harness.ppo.actor import _StatsAccumulator

    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)
    H = torch.tensor([[0.1, 0.2, 0.3, 0.4, 5.0]])
    cfg = PPOActorConfig(top_entropy_quantile=0.25)
    z = torch.zeros(1, 5)
    _, _, stats = _actor_loss(cfg, z, z, torch.ones(1, 5), mask, H)
    acc = _StatsAccumulator()
    acc.add({"mask": mask, "advantages": torch.ones(1, 5)}, stats, 0.0, 1.0)
    # τ = quantile([.1,.2,.3,.4], .75) = 0.325: one of the four valid tokens is kept
    assert acc.result()["policy/entropy_masked_frac"] == pytest.approx(0.75)


# ------------------------------------------------------------------ truncated completions


def _rollout_batch(rewards, truncated, lens=(3, 3, 3, 3), T=4):
    B = len(rewards)
    loss_mask = torch.zeros(B, T + 1, dtype=torch.long)
    for i, n in enumerate(lens):
        loss_mask[i, 1 : 1 + n] = 1
    return {
        "input_ids": torch.zeros(B, T + 1, dtype=torch.long),
        "attention_mask": torch.ones(B, T + 1, dtype=torch.long),
        "loss_mask": loss_mask,
        "logprobs": torch.zeros(B, T + 1),
        "current_logprobs": torch.zeros(B, T + 1),
        "rewards": torch.tensor(rewards),
        "group_sizes": [2, 2],
        "truncated": torch.tensor(truncated),
    }


GROUP = NormConfig(mean_level="group", std_level="group")


def test_truncated_mask_drops_the_rows_but_their_reward_stays_in_the_group_stats():
    rewards, trunc = [1.0, 0.0, 0.5, 0.0], [False, True, False, False]
    keep = PPOActor(PPOActorConfig(reward_norm=GROUP)).compute_advantages(
        _rollout_batch(rewards, trunc)
    )
    masked = PPOActor(
        PPOActorConfig(reward_norm=GROUP, truncated_completions="mask")
    ).compute_advantages(_rollout_batch(rewards, trunc))
    assert masked["mask"][1].sum() == 0 and keep["mask"][1].sum() == 3
    assert (masked["advantages"][1] == 0).all()
    # row 0's advantage is the same: the truncated row's reward still centred the group
    close(masked["advantages"][0], keep["advantages"][0])
    assert truncated_row_mask(torch.ones(2, 3), torch.tensor([True, False])).tolist() == [
        [False] * 3,
        [True] * 3,
    ]


def test_truncated_zero_reward_zeroes_the_normalized_reward_and_keeps_the_tokens():
    rewards, trunc = [1.0, 0.0, 0.5, 0.0], [False, True, False, False]
    b = PPOActor(
        PPOActorConfig(reward_norm=GROUP, truncated_completions="zero_reward")
    ).compute_advantages(_rollout_batch(rewards, trunc))
    base = PPOActor(PPOActorConfig(reward_norm=GROUP)).compute_advantages(
        _rollout_batch(rewards, trunc)
    )
    assert b["normalized_rewards"][1] == 0 and base["normalized_rewards"][1] < 0
    close(b["normalized_rewards"][[0, 2, 3]], base["normalized_rewards"][[0, 2, 3]])
    assert b["mask"][1].sum() == 3  # tokens stay in the loss
    assert (b["advantages"][1][b["mask"][1]] == 0).all()


# ------------------------------------------------------------------ overlong penalty


def test_overlong_penalty_golden():
    lens = torch.tensor([3, 4, 5, 6, 8])
    close(overlong_penalty(lens, 8, 4, 1.0), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    close(overlong_penalty(lens, 8, 4, 0.5), torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5]))
    close(overlong_penalty(lens, 8, 8, 2.0), torch.tensor([-0.75, -1.0, -1.25, -1.5, -2.0]))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.data())
def test_overlong_penalty_is_zero_before_the_buffer_and_monotone(max_new, data):
    lc = data.draw(st.integers(1, max_new))
    f = data.draw(st.floats(0, 5))
    lens = torch.arange(0, max_new + 1)
    pen = overlong_penalty(lens, max_new, lc, f)
    assert (pen[: max_new - lc + 1] == 0).all()
    assert (pen[1:] <= pen[:-1] + 1e-6).all()
    assert pen[-1].item() == pytest.approx(-f, abs=1e-5)


# ------------------------------------------------------------------ zero-variance groups


def test_zero_variance_groups_golden():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.3])
    assert zero_variance_groups(r, [2, 2, 2, 1]).tolist() == [True, False, True, False]


def _rb(rows, P, T, truncated=None):
    """A RolloutBatch of ``rows`` rows, prompt width P, response width T (row i: i+1 tokens)."""
    B = rows
    resp_mask = torch.zeros(B, T, dtype=torch.long)
    for i in range(B):
        resp_mask[i, : min(i + 1, T)] = 1
    ids = torch.cat([torch.full((B, P), 7), torch.arange(B * T).view(B, T) + 100], 1)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=torch.cat([torch.ones(B, P, dtype=torch.long), resp_mask], 1),
        loss_mask=torch.cat([torch.zeros(B, P, dtype=torch.long), resp_mask], 1),
        logprobs=torch.cat([torch.zeros(B, P), -resp_mask.float()], 1),
        prompt_lens=torch.full((B,), P),
        response_lens=resp_mask.sum(1),
        truncated=torch.zeros(B, dtype=torch.bool) if truncated is None else truncated,
        completions=[f"c{i}" for i in range(B)],
        group_sizes=[2] * (B // 2),
        prompt_width=P,
    )


def _round(rb, rewards):
    n = len(rewards)
    r = torch.tensor(rewards)
    return Round(rb, [f"e{i}" for i in range(n)], [(0.0, x) for x in rewards], r, r * 0)


def test_concat_rollouts_repads_prompts_left_and_responses_right():
    a, b = _rb(2, P=2, T=3), _rb(2, P=4, T=1)
    c = concat_rollouts([a, b], pad_id=0)
    assert c.input_ids.shape == (4, 4 + 3) and c.prompt_width == 4
    # a's prompt is left-padded by 2, b's response right-padded by 2
    assert c.attention_mask[0].tolist() == [0, 0, 1, 1, 1, 0, 0]
    assert c.loss_mask[2].tolist() == [0, 0, 0, 0, 1, 0, 0]
    assert c.input_ids[0, 4:].tolist() == a.input_ids[0, 2:].tolist()
    assert c.group_sizes == [2, 2] and c.completions == ["c0", "c1", "c0", "c1"]
    # the tokens and log-probs of every row are unchanged, only re-padded
    for src, rows in ((a, [0, 1]), (b, [2, 3])):
        for i, r in enumerate(rows):
            assert c.logprobs[r].sum() == src.logprobs[i].sum()
            assert c.loss_mask[r].sum() == src.loss_mask[i].sum()


def test_refill_drops_zero_variance_groups_and_refills_to_the_batch_size():
    first = _round(_rb(4, 2, 3), [1.0, 1.0, 0.0, 1.0])  # group 0 zero-variance
    extra = [_round(_rb(4, 3, 2), [0.0, 0.0, 0.5, 0.0]), _round(_rb(4, 2, 3), [1.0, 0.0, 0.0, 1.0])]
    draws = iter(extra)
    out = refill(first, lambda: next(draws), n_groups=2, max_rounds=3, pad_id=0)
    assert out.extra_rounds == 1 and out.dropped == 2
    assert out.train is not None and out.train.rb.group_sizes == [2, 2]
    close(out.train.rewards, torch.tensor([0.0, 1.0, 0.5, 0.0]))
    # no rounds left: trains on what is left; nothing left: no batch
    alone = refill(first, lambda: next(draws), n_groups=2, max_rounds=0, pad_id=0)
    assert alone.train is not None and alone.train.rb.group_sizes == [2]
    flat = _round(_rb(4, 2, 3), [1.0, 1.0, 0.0, 0.0])
    empty = refill(flat, lambda: flat, n_groups=2, max_rounds=2, pad_id=0)
    assert empty.train is None and empty.extra_rounds == 2 and empty.dropped == 6
    picked = select_groups(first, [1])
    assert picked.per_row == ["e2", "e3"] and picked.rb.completions == ["c2", "c3"]


def test_a_step_with_no_group_left_skips_its_update_and_the_run_completes(monkeypatch):
    import harness.run.collect as collect
    import harness.run.loop as loop

    monkeypatch.setattr(collect, "score_parts", lambda task, e, c: (0.0, 0.0))
    d = tiny_reverse(
        2,
        rollout={"max_new_tokens": 3, "zero_variance_filter": True, "max_resample_rounds": 1},
        ppo={"ppo_n_minibatches": 1},
        warm_start={"steps": 0},
        eval={"every": 0, "n_prompts": 2},
    )
    res = loop.run(from_dict(RunConfig, d))
    h = res.history
    assert res.status == "completed" and res.steps_done == 2
    assert h["rollout/update_skipped"] == [1.0, 1.0]
    assert h["rollout/resample_rounds"] == [1.0, 1.0]
    assert h["rollout/zero_variance_dropped"] == [4.0, 4.0]
    assert "2 step(s) without an update" in res.tags["skipped_updates"]
    assert "stability/optimizer_steps" not in h  # no update ran
    assert math.isfinite(h["eval/reward"][-1])  # the final evaluation still ran


def test_every_option_metric_is_logged_when_its_option_is_on(monkeypatch):
    import harness.run.collect as collect
    import harness.run.loop as loop

    # a reward that varies with the completion, so some groups keep a signal
    monkeypatch.setattr(
        collect, "score_parts", lambda task, e, c: (0.0, float(sum(map(ord, c)) % 2))
    )
    logged: set[str] = set()
    for truncated in ("mask", "zero_reward"):
        ppo = {
            "ppo_n_minibatches": 1,
            "top_entropy_quantile": 0.5,
            "truncated_completions": truncated,
            "overlong_reward_penalty": True,
            "overlong_tokens": 2,
            "overlong_penalty_factor": 1.0,
        }
        d = tiny_reverse(
            2,
            rollout={"max_new_tokens": 3, "zero_variance_filter": True, "max_resample_rounds": 3},
            ppo=ppo,
            warm_start={"steps": 0},
            eval={"every": 0, "n_prompts": 2},
        )
        res = loop.run(from_dict(RunConfig, d))
        assert res.status == "completed"
        logged |= {k for k, v in res.history.items() if any(math.isfinite(x) for x in v)}
        assert all(x <= 0 for x in res.history["reward/overlong_penalty"])
    # the engine's weight-sync time needs the inference engine: tests/run/test_engine.py asserts it
    expected = OPTION_METRICS - {"perf/weight_sync_s"}
    assert expected <= logged, sorted(expected - logged)
    assert "perf/weight_sync_s" not in logged


# ------------------------------------------------------------------ prompt-mean


def test_prompt_mean_golden():
    contrib = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [4.0, 4.0, 4.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    gid = torch.tensor([0, 0, 1, 2])
    # prompt 0: 6/3 = 2; prompt 1: 12/3 = 4; prompt 2: no tokens, still counts → (2+4+0)/3
    close(prompt_mean(contrib, mask, gid), torch.tensor(2.0))
    assert group_ids_from_sizes([2, 1, 3], 6, torch.device("cpu")).tolist() == [0, 0, 1, 2, 2, 2]
    assert group_ids_from_sizes(None, 3, torch.device("cpu")).tolist() == [0, 1, 2]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_prompt_mean_is_token_mean_for_equal_prompt_token_counts_and_seq_mean_for_single_rows(
    seed,
):
    g = torch.Generator().manual_seed(seed)
    lt = -torch.rand(4, 5, generator=g) * 3
    old = lt + 0.2 * torch.randn(4, 5, generator=g)
    adv = torch.randn(4, 5, generator=g)
    # prompts {0,1} and {2,3}, 6 tokens each
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]])
    mask = mask.bool()
    pm, _ = ppo_actor_loss(
        lt, old, old, adv, mask, loss_agg_mode="prompt-mean", group_ids=torch.tensor([0, 0, 1, 1])
    )
    tm, _ = ppo_actor_loss(lt, old, old, adv, mask, loss_agg_mode="token-mean")
    close(pm, tm)
    single, _ = ppo_actor_loss(
        lt, old, old, adv, mask, loss_agg_mode="prompt-mean", group_ids=torch.arange(4)
    )
    seq, _ = ppo_actor_loss(lt, old, old, adv, mask, loss_agg_mode="seq-mean-token-mean")
    close(single, seq)


def test_every_objective_declares_whether_it_allows_prompt_mean():
    allows = {name for name, o in OBJECTIVES.items() if "prompt-mean" in o.aggregations}
    assert set(OBJECTIVES) - allows == {"luspo"}  # LUSPO is its own aggregation
    with pytest.raises(ValueError, match="prompt-mean' means nothing under policy_loss 'luspo'"):
        PPOActorConfig(policy_loss="luspo", loss_agg_mode="prompt-mean")
    g = torch.Generator().manual_seed(1)
    lt = -torch.rand(4, 5, generator=g) * 3
    old = lt + 0.2 * torch.randn(4, 5, generator=g)
    adv = torch.randn(4, 5, generator=g)
    mask = torch.rand(4, 5, generator=g) < 0.8
    for name in sorted(allows):
        x = lt.clone().requires_grad_(True)
        loss, _ = lookup(name).loss(
            x,
            old,
            old,
            adv,
            mask,
            loss_agg_mode="prompt-mean",
            group_ids=torch.tensor([0, 0, 1, 1]),
        )
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(x.grad).all(), name
    with pytest.raises(ValueError, match="needs the rows' group_ids"):
        ppo_actor_loss(lt, old, old, adv, mask, loss_agg_mode="prompt-mean")


def test_prompt_mean_in_the_actor_uses_the_batch_groups_across_minibatch_rows():
    b = _rollout_batch([1.0, 0.0, 0.5, 0.0], [False] * 4, lens=(1, 3, 2, 2))
    actor = PPOActor(PPOActorConfig(loss_agg_mode="prompt-mean"))
    b["current_logprobs"] = -torch.rand(4, 5)
    actor.compute_advantages(b)
    assert b["group_ids"].tolist() == [0, 0, 1, 1]
    loss, _ = actor.compute_loss(b)
    _, st_ = ppo_actor_loss(
        torch.roll(b["current_logprobs"], -1, 1),
        b["prox_logprobs"],
        b["old_logprobs"],
        b["advantages"],
        b["mask"],
    )
    per_tok = torch.where(b["mask"], st_["loss"], torch.zeros(()))
    want = (per_tok[:2].sum() / 4 + per_tok[2:].sum() / 4) / 2
    close(loss, want)


# ------------------------------------------------------------------ config, TRL map, export


def _cfg(**sets):
    d = {"rollout": {"max_new_tokens": 8}, "ppo": {}}
    for k, v in sets.items():
        sec, key = k.split("__")
        d.setdefault(sec, {})[key] = v
    return from_dict(RunConfig, d)


BAD = [
    (["ppo.top_entropy_quantile=1.5"], "ppo.top_entropy_quantile"),
    (["ppo.truncated_completions=drop"], "must be one of"),
    (["ppo.loss_agg_mode=prompt_mean"], "must be one of"),
    (["ppo.overlong_reward_penalty=true"], "overlong_tokens must be set"),
    (["ppo.overlong_tokens=2"], "overlong_tokens means nothing with overlong_reward_penalty"),
    (
        [
            "ppo.overlong_reward_penalty=true",
            "ppo.overlong_tokens=99",
            "ppo.overlong_penalty_factor=1",
        ],
        "ppo.overlong_tokens (99) must be at most rollout.max_new_tokens",
    ),
    (["rollout.max_resample_rounds=2"], "max_resample_rounds means nothing"),
    (["rollout.max_resample_rounds=-1"], "rollout.max_resample_rounds"),
    (
        ["trainer=trl", "rollout.zero_variance_filter=true", "ppo.reward_norm.mean_level=group"],
        "zero_variance_filter=true: not expressible with trainer: trl (GRPOTrainer has no",
    ),
    (
        [
            "trainer=trl",
            "ppo.truncated_completions=zero_reward",
            "ppo.reward_norm.mean_level=group",
        ],
        "not expressible with trainer: trl (TRL can drop truncated completions (mask) but not",
    ),
    (
        ["trainer=trl", "ppo.loss_agg_mode=prompt-mean", "ppo.reward_norm.mean_level=group"],
        "not expressible with trainer: trl (TRL has no prompt-level loss_type",
    ),
]


@pytest.mark.parametrize("sets,expect", BAD)
def test_bad_values_are_one_line_exit_2(sets, expect, tmp_path):
    results = tmp_path / "r"
    args = ["run", "--results-dir", str(results)]
    for s in [*sets, "rollout.max_new_tokens=12"]:
        args += ["--set", s]
    r = CliRunner().invoke(app, args)
    err = r.stderr if r.stderr is not None else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, (r.exit_code, r.output)
    assert expect in lines[0] and "Traceback" not in r.output, lines[0]
    assert not (results / "mlflow.db").exists()


def _on():
    return from_dict(
        RunConfig,
        {
            "rollout": {
                "max_new_tokens": 16,
                "zero_variance_filter": True,
                "max_resample_rounds": 2,
            },
            "ppo": {
                "top_entropy_quantile": 0.2,
                "truncated_completions": "mask",
                "overlong_reward_penalty": True,
                "overlong_tokens": 4,
                "overlong_penalty_factor": 0.5,
                "loss_agg_mode": "prompt-mean",
                "reward_norm": {"mean_level": "group", "std_level": "group"},
            },
        },
    )


def test_export_names_each_option_in_each_target_or_says_it_cannot():
    cfg = _on()
    trl = export_trl(cfg)
    assert "top_entropy_quantile=0.2," in trl and "mask_truncated_completions=True," in trl
    assert "# rollout.zero_variance_filter: not expressible in TRL" in trl
    assert "# ppo.loss_agg_mode: not expressible in TRL" in trl and "loss_type=" not in trl
    verl = export_verl(cfg)
    for line in (
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "+reward_model.reward_kwargs.max_resp_len=16",
        "reward_model.reward_manager=dapo",
    ):
        assert line in verl.splitlines(), line
    assert "# ppo.top_entropy_quantile=0.2: verl" in verl
    assert "# ppo.loss_agg_mode=prompt-mean: verl has no" in verl
    assert "loss_agg_mode=" not in "".join(x for x in verl.splitlines() if not x.startswith("#"))
    areal = export_areal(cfg)
    assert "overlong_reward_penalty: true" in areal and "overlong_tokens: 4" in areal
    assert "overlong_penalty_factor: 0.5" in areal
    assert "# ppo.truncated_completions=mask: AReaL cannot" in areal
    assert "# rollout.zero_variance_filter: AReaL" in areal
    zero = export_areal(_cfg(ppo__truncated_completions="zero_reward"))
    assert "mask_no_eos_with_zero: true" in zero
    # defaults: nothing new in any target
    plain = _cfg()
    assert "top_entropy" not in export_trl(plain) and "filter_groups" not in export_verl(plain)
    assert "overlong" not in export_areal(plain)


def test_the_trl_trainer_gets_the_options_trl_has():
    from harness.peers.trl import grpo_kwargs

    cfg = from_dict(
        RunConfig,
        {
            "trainer": "trl",
            "rollout": {"max_new_tokens": 8},
            "ppo": {
                "top_entropy_quantile": 0.2,
                "truncated_completions": "mask",
                "overlong_reward_penalty": True,
                "overlong_tokens": 4,
                "overlong_penalty_factor": 1.0,
                "reward_norm": {"mean_level": "group", "std_level": "group"},
            },
        },
    )
    kw = grpo_kwargs(cfg)
    assert kw["top_entropy_quantile"] == 0.2 and kw["mask_truncated_completions"] is True


def test_the_options_train_through_the_cli(tmp_path):
    assert "rollout.max_new_tokens=4" in SMALL
    assert_trains_through_the_cli(
        tmp_path,
        "ppo.top_entropy_quantile=0.2",
        "ppo.truncated_completions=mask",
        "ppo.overlong_reward_penalty=true",
        "ppo.overlong_tokens=2",
        "ppo.overlong_penalty_factor=1.0",
        "rollout.zero_variance_filter=true",
        "rollout.max_resample_rounds=1",
        "ppo.loss_agg_mode=prompt-mean",
        "ppo.reward_norm.mean_level=group",
        "ppo.reward_norm.std_level=group",
    )
