"""ppo.correction: golden tiny tensors, edge cases, the config (presets as grid values, one-line
errors), composition with every objective, the step metrics, docs freshness and one CLI run."""

from __future__ import annotations

import copy
import math
import sqlite3
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config import PPOActorConfig, build_run_config
from harness.config.experiment import load_experiment
from harness.core.configtools import ConfigError
from harness.model.build import TinyModelConfig, build_model, build_tokenizer
from harness.ppo import RejectionSampling
from harness.ppo.actor import PPOActor
from harness.ppo.corrections import PRESETS, Correction, Filter
from harness.ppo.corrections.docs import markdown
from harness.ppo.objectives import OBJECTIVES, lookup, ppo_actor_loss
from harness.sampling.local import sample
from tests.support.batches import stale_update_batch
from tests.support.objective_cli import SMALL
from tests.support.tiny import TINY

ROOT = Path(__file__).resolve().parents[2]
LOG = math.log


def row(*ws: float) -> tuple[torch.Tensor, ...]:
    """One row whose behaviour weights are ``ws`` (ℓθ = ℓp, so r = 1 and L = −A per token)."""
    lp = torch.full((1, len(ws)), -1.0)
    lb = lp - torch.tensor([[LOG(w) for w in ws]])
    lt = lp.clone().requires_grad_()
    A = torch.ones(1, len(ws))
    M = torch.ones(1, len(ws), dtype=torch.bool)
    return lt, lp, lb, A, M


def loss_of(c, *xs, **kw):
    out, stats = ppo_actor_loss(*xs, correction=c, **kw)
    return float(out.detach()), stats


# --------------------------------------------------------------------------- golden


def test_token_tis_golden():
    loss, stats = loss_of("token_tis", *row(3.0, 0.5, 1.0))
    assert loss == pytest.approx(-(2.0 + 0.5 + 1.0) / 3)  # 3 truncated to 2
    assert stats["correction_truncated"].tolist() == [[True, False, False]]
    assert not stats["correction_masked"].any()
    assert stats["behave_imp_weight"][0].tolist() == pytest.approx([2.0, 0.5, 1.0])


def test_icepop_golden():
    loss, stats = loss_of("icepop", *row(3.0, 0.4, 6.0))
    assert loss == pytest.approx(-3.0 / 3)  # 0.4 and 6 get weight 0, the denominator stays 3
    assert stats["correction_masked"].tolist() == [[False, True, True]]


def test_sequence_weights_golden():
    xs = row(3.0, 0.5, 1.0)  # product 1.5, geometric mean 1.5 ** (1/3)
    assert loss_of("seq_mis", *xs)[0] == pytest.approx(-1.5)
    assert loss_of("seq_tis", *xs)[0] == pytest.approx(-1.5)
    geo = Correction(weight="sequence_geometric")
    assert loss_of(geo, *xs)[0] == pytest.approx(-(1.5 ** (1 / 3)))
    big = row(3.0, 2.0, 1.0)  # product 6 > 3: the whole row gets 0 under sequence_mask
    assert loss_of("seq_mis", *big)[0] == 0.0
    assert loss_of("seq_tis", *big)[0] == pytest.approx(-2.0)


def test_batch_normalize_golden():
    c = Correction(weight="token", clip_max=2.0, batch_normalize=True)
    loss, stats = loss_of(c, *row(3.0, 0.5, 1.0))
    assert loss == pytest.approx(-1.0)  # [2, .5, 1] / (7/6) sums to 3
    assert stats["correction_norm_factor"] == pytest.approx(3.5 / 3)


def test_filters_golden_and_denominators():
    lt, lp, lb, A, M = (torch.cat(t) for t in zip(row(1.0, 1.0), row(4.0, 4.0), strict=True))
    lt = lt.detach().requires_grad_()
    k1 = Filter(level="sequence", metric="k1", direction="ref_behave", agg="sum", upper=1.0)
    pre, stats = loss_of(Correction(filters=(k1,)), lt, lp, lb, A, M)
    assert pre == pytest.approx(-2 / 4)  # row 2: Σ log w = 2 log 4 > 1, dropped, still counted
    assert stats["correction_masked"].tolist() == [[False, False], [True, True]]
    post, _ = loss_of(Correction(filters=(k1,), denominator="post"), lt, lp, lb, A, M)
    assert post == pytest.approx(-1.0)  # verl: the dropped row leaves the denominator
    # The same statistic in the other KL direction is −Σ log w < 1: nothing dropped.
    other = Filter(level="sequence", metric="k1", agg="sum", upper=1.0)
    assert loss_of(Correction(filters=(other,)), lt, lp, lb, A, M)[0] == pytest.approx(-1.0)


def test_stacked_filters_are_anded_and_min_aggregation():
    xs = row(0.5, 1.0, 1.5)
    lo = Filter(level="sequence", agg="min", lower=0.6)
    hi = Filter(level="sequence", agg="max", upper=2.0)
    assert loss_of(Correction(filters=(hi,)), *xs)[0] == pytest.approx(-1.0)
    assert loss_of(Correction(filters=(hi, lo)), *xs)[0] == 0.0
    tok = Filter(lower=0.6, upper=1.2)
    assert loss_of(Correction(filters=(tok,)), *xs)[0] == pytest.approx(-1 / 3)


def test_opsm_golden():
    lt, lp, lb, A, M = row(1.0, 1.0)
    lb = lb - 1.0  # mean(ℓb − ℓθ) = −1 ... the sampler is less likely: k1 = ℓb − ℓθ < 0.5
    assert loss_of("opsm", lt, lp, lb, -A, M)[0] == pytest.approx(1.0)
    lb = lb + 2.0  # now mean(ℓb − ℓθ) = 1 > 0.5
    assert loss_of("opsm", lt, lp, lb, -A, M)[0] == 0.0  # A < 0: dropped
    assert loss_of("opsm", lt, lp, lb, A, M)[0] == pytest.approx(-1.0)  # A > 0: kept


def test_truncate_filter_is_areal_clamp():
    """rejection_sampling action 'clamp' at sequence level: the geometric-mean weight is
    truncated only where the row's aggregate fails."""
    rs = RejectionSampling(level="sequence", action="clamp", agg="sum", upper=2.0)
    xs = row(3.0, 1.0)
    w_geo = math.sqrt(3.0)  # product 3 > 2 fails: truncate √3 to [0, 2] → unchanged
    assert float(ppo_actor_loss(*xs, rejection_sampling=rs)[0].detach()) == pytest.approx(-w_geo)
    c = Correction(
        weight="sequence_geometric",
        filters=(Filter(level="sequence", agg="sum", upper=2.0, lower=0.0, action="truncate"),),
    )
    assert loss_of(c, *xs)[0] == pytest.approx(-w_geo)


@pytest.mark.parametrize(
    "rs",
    [
        RejectionSampling(level="token", upper=1.2, lower=0.8),
        RejectionSampling(level="sequence", metric="kl_k3", agg="max", upper=0.05),
        RejectionSampling(level="token", action="clamp", upper=1.3),
    ],
)
def test_rejection_sampling_is_the_written_out_correction(rs):
    g = torch.Generator().manual_seed(0)
    lb = -torch.rand(3, 5, generator=g) * 2
    lp = lb + 0.3 * torch.randn(3, 5, generator=g)
    lt = (lp + 0.05 * torch.randn(3, 5, generator=g)).requires_grad_()
    A, M = torch.randn(3, 5, generator=g), torch.rand(3, 5, generator=g) > 0.2
    metric = {"kl_k3": "k3"}.get(rs.metric, rs.metric)
    c = Correction(
        weight="token",
        filters=(
            Filter(
                level=rs.level,
                metric=metric,
                direction="ref_behave",
                agg=rs.agg,
                lower=rs.lower,
                upper=rs.upper,
                action="mask" if rs.action == "mask" else "truncate",
            ),
        ),
    )
    a, _ = ppo_actor_loss(lt, lp, lb, A, M, rejection_sampling=rs)
    b, _ = ppo_actor_loss(lt, lp, lb, A, M, correction=c)
    assert torch.allclose(a, b)


# --------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("name", list(PRESETS))
def test_all_masked_gives_zero_loss_and_gradient(name):
    lt, lp, lb, A, M = row(3.0, 0.5)
    M = torch.zeros_like(M)
    out, stats = ppo_actor_loss(lt, lp, lb, A, M, correction=name)
    out.backward()
    assert float(out.detach()) == 0.0 and float(lt.grad.abs().sum()) == 0.0
    assert not stats["correction_masked"].any()


def test_nan_behaviour_logprob_gives_weight_one():
    lt, lp, lb, A, M = row(3.0, 0.5, 1.0)
    lb = lb.clone()
    lb[0, 1] = float("nan")
    loss, stats = loss_of(Correction(weight="token"), lt, lp, lb, A, M)
    assert loss == pytest.approx(-(3.0 + 1.0 + 1.0) / 3)
    assert math.isfinite(loss)


# --------------------------------------------------------------------------- config


def test_presets_are_grid_values(tmp_path):
    doc = {
        "name": "corr",
        "base": {"task": "reverse", "ppo": {"use_decoupled_loss": True}},
        "grid": {"ppo.correction": ["token_tis", "icepop", "opsm", "geo_rs"]},
        "steps": 2,
    }
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(doc))
    spec = load_experiment(path)
    assert len(spec.cells) == 4
    bad = dict(doc, grid={"ppo.correction": ["token_tis", "tokn_tis"]})
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    assert "ppo.correction" in str(err.value) and "token_tis" in str(err.value)
    assert "\n" not in str(err.value)


def test_block_from_yaml_and_preset_expansion():
    cfg = build_run_config(
        {},
        {
            "ppo.use_decoupled_loss": True,
            "ppo.correction": {
                "weight": "token",
                "clip_max": 2,
                "filters": [{"level": "sequence", "metric": "k3", "upper": 0.1}],
            },
        },
    )
    c = cfg.ppo.correction
    assert c == Correction(
        weight="token", clip_max=2.0, filters=(Filter(level="sequence", metric="k3", upper=0.1),)
    )
    assert build_run_config({}, {"ppo.correction": "bypass"}).ppo.correction.bypass


@pytest.mark.parametrize(
    "overrides,expect",
    [
        ({"ppo.correction": "nope"}, "ppo.correction must be a mapping or one of token_tis"),
        ({"ppo.correction": {"weight": "tok"}}, "ppo.correction.weight: must be one of"),
        (
            {"ppo.correction": {"weight": "token", "clip_min": 3, "clip_max": 2}},
            "clip_min (3.0) must be <= clip_max",
        ),
        (
            {"ppo.correction": {"filters": [{"lower": 2, "upper": 1}]}},
            "filters[].lower (2.0) must be <= upper",
        ),
        (
            {"ppo.correction": {"filters": [{"metric": "k3", "action": "truncate", "upper": 1}]}},
            "truncate' requires metric 'ratio'",
        ),
        ({"ppo.correction": {}}, "an empty correction"),
        ({"ppo.correction": "token_tis", "ppo.rejection_sampling": {"upper": 2.0}}, "not both"),
        (
            {"ppo.correction": "bypass", "ppo.use_decoupled_loss": True},
            "bypass needs use_decoupled_loss=false",
        ),
    ],
)
def test_bad_values_are_one_line_config_errors(overrides, expect):
    with pytest.raises(ConfigError) as err:
        build_run_config({}, overrides)
    assert expect in str(err.value) and "\n" not in str(err.value), str(err.value)


# --------------------------------------------------------------------------- composition


def _random(seed=0, B=4, T=6):
    g = torch.Generator().manual_seed(seed)
    lb = -torch.rand(B, T, generator=g) * 2 - 0.1
    lp = lb + 0.2 * torch.randn(B, T, generator=g)
    lt = (lp + 0.05 * torch.randn(B, T, generator=g)).requires_grad_()
    M = torch.arange(T)[None] < torch.tensor([[6], [3], [5], [1]])
    A = torch.randn(B, 1, generator=g).expand(B, T) * M
    return lt, lp, lb, A, M


@pytest.mark.parametrize("objective", list(OBJECTIVES))
@pytest.mark.parametrize("name", ["token_tis", "seq_mis", "icepop", "opsm", "geo_rs"])
def test_every_objective_composes_with_every_correction(objective, name):
    o = lookup(objective)
    agg = "token-mean" if "token-mean" in o.aggregations else o.aggregations[0]
    lt, lp, lb, A, M = _random()
    loss, stats = o.loss(lt, lp, lb, A, M, correction=name, loss_agg_mode=agg)
    loss.backward()
    assert math.isfinite(float(loss)) and torch.isfinite(lt.grad).all()
    assert "correction_masked" in stats


@pytest.fixture(scope="module")
def setup():
    tok = build_tokenizer()
    tiny = TinyModelConfig(**TINY)
    model = build_model(tok, tiny, seed=0)
    gen = torch.Generator().manual_seed(0)
    rb = sample(
        model, tok, ["123>", "4567>", "89>", "2468>"], n_samples=2, max_new_tokens=5, generator=gen
    )
    return model, stale_update_batch(rb)


@pytest.mark.parametrize(
    "policy_loss,level,correction",
    [
        ("ppo", "token", "token_tis"),
        ("cispo", "token", "icepop"),
        ("ppo", "sequence", "seq_mis"),  # GSPO
        ("ppo", "token", Correction(weight="token", filters=(Filter(metric="k2", upper=-1.0),))),
    ],
)
def test_a_training_step_logs_the_correction_metrics(setup, policy_loss, level, correction):
    model, batch = setup
    m = copy.deepcopy(model)
    before = [p.detach().clone() for p in m.parameters()]
    cfg = PPOActorConfig(
        policy_loss=policy_loss,
        importance_sampling_level=level,
        use_decoupled_loss=True,
        correction=correction,
        ppo_n_minibatches=2,
    )
    stats = PPOActor(cfg, m, torch.optim.SGD(m.parameters(), lr=1e-2)).ppo_update(dict(batch))
    for key in ("policy/correction_masked_frac", "policy/correction_truncated_frac"):
        assert 0.0 <= stats[key] <= 1.0
    if isinstance(correction, Correction):  # k2 ≤ −1 fails everywhere: nothing is learned
        assert stats["policy/correction_masked_frac"] == 1.0
        assert all(torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))
        return
    assert stats["stability/optimizer_steps"] == 2
    assert 0 <= stats["policy/behave_weight_min"] <= stats["policy/behave_weight_max"]
    if correction == "token_tis":
        assert stats["policy/behave_weight_max"] <= 2.0
        assert stats["policy/correction_masked_frac"] == 0.0
    assert not all(torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))


# --------------------------------------------------------------------------- docs, CLI


def test_docs_corrections_is_generated_from_the_declarations():
    text = (ROOT / "docs" / "corrections.md").read_text()
    assert text == markdown(), "regenerate: python -m harness.ppo.corrections > docs/corrections.md"
    for name in PRESETS:
        assert f"| `{name}` |" in text


def test_cli_run_with_token_tis_and_staleness_logs_the_correction_metrics(tmp_path):
    args = ["run", "--results-dir", str(tmp_path / "r")]
    for s in [
        "ppo.use_decoupled_loss=true",
        "ppo.correction=token_tis",
        "rollout.staleness=2",
        *SMALL,
    ]:
        args += ["--set", s]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "completed" in r.output.lower()
    db = sqlite3.connect(tmp_path / "r" / "mlflow.db")
    keys = {k for (k,) in db.execute("select distinct key from metrics")}
    assert {
        "policy/correction_masked_frac",
        "policy/correction_truncated_frac",
        "policy/behave_weight_max",
    } <= keys


def test_cli_bad_correction_is_one_line_exit_2(tmp_path):
    args = ["run", "--results-dir", str(tmp_path / "r"), "--set", "ppo.correction=tokn_tis"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "ppo.correction" in lines[0] and "token_tis" in lines[0]
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*.db"))
