"""Settings and inputs that once changed nothing, or the wrong thing, without a word: each now
acts as the user expects or is refused in one line on stderr (exit 2, nothing written)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.support.experiments import grid_file
from tests.support.tiny import tiny_reverse


@pytest.fixture
def runner():
    return CliRunner()


def assert_refused(result, expect: str, results: Path) -> str:
    err = result.stderr if result.stderr is not None else result.output
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in (err or "")
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expect in lines[0], lines[0]
    assert not results.exists()
    return lines[0]


def _run(runner, tmp_path, *sets: str):
    results = tmp_path / "results"
    args = ["run", "experiments/run-default.yaml", "--results-dir", str(results)]
    for s in sets:
        args += ["--set", s]
    return runner.invoke(app, args), results


# --- a jsonl row must carry exactly its two keys ------------------------------------------------


@pytest.mark.parametrize(
    "row,expect",
    [
        ({"prompt": "b="}, "line 2: missing key 'answer'"),
        ({"prompt": "b=", "anwser": "b"}, "line 2: unknown key 'anwser' (allowed: 'prompt', "),
    ],
)
def test_jsonl_row_without_its_answer_is_refused(row, expect, tmp_path, runner):
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "a=", "answer": "a"}) + "\n" + json.dumps(row) + "\n")
    result, results = _run(runner, tmp_path, f"task=jsonl:{data}")
    line = assert_refused(result, expect, results)
    assert str(data) in line


def test_hf_jsonl_ignores_other_columns_but_not_a_missing_answer(tmp_path):
    from harness.tasks import get_task

    data = tmp_path / "pairs.jsonl"
    rows = [{"q": f"{i}=", "a": str(i), "level": 3} for i in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task(f"hf:{data}", prompt_field="q", answer_field="a")
    assert sorted(ex.answer for ex in task.train + task.held_out) == ["0", "1", "2", "3"]
    data.write_text(data.read_text() + json.dumps({"q": "9=", "answr": "9"}) + "\n")
    with pytest.raises(ValueError, match="line 5: missing key 'a'"):
        get_task(f"hf:{data}", prompt_field="q", answer_field="a")


# --- ppo.correction acts without the decoupled loss (TRL's semantics) ---------------------------

import torch  # noqa: E402

from harness.ppo import PPOActor, PPOConfig, normalization  # noqa: E402
from harness.ppo.normalization import NormConfig  # noqa: E402


def _batch(seed: int = 0, B: int = 4, L: int = 6) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(0, 20, (B, L), generator=g),
        "attention_mask": torch.ones(B, L),
        "loss_mask": torch.tensor([[0, 0, 1, 1, 1, 0]] * B),
        "logprobs": -torch.rand(B, L, generator=g),
        "current_logprobs": -torch.rand(B, L, generator=g),
        "rewards": torch.tensor([1.0, 0.0, 0.5, 0.0]),
        "group_sizes": [2, 2],
    }


def test_correction_weighs_the_learner_against_the_sampler_without_the_decoupled_loss():
    b = _batch()
    # π_prox = the learner at the old parameters (here: given, as AReaL's prox_logp)
    prox = torch.roll(b["logprobs"], -1, 1) + torch.tensor([0.0, 0.0, 0.0, 2.0])[:, None]
    cfg = PPOConfig(correction="token_tis", use_decoupled_loss=False)
    _, st = PPOActor(cfg).compute_loss({**b, "prox_logp": prox})
    w = st["behave_imp_weight"][st["behave_mask"]]
    # ρ = exp(ℓp − ℓb): 1 on the rows where the learner agrees, e² truncated to 2 on the last
    assert w[:9].tolist() == pytest.approx([1.0] * 9)
    assert w[9:].tolist() == pytest.approx([2.0] * 3)
    same = PPOConfig(correction="token_tis", use_decoupled_loss=True)
    _, st2 = PPOActor(same).compute_loss({**b, "prox_logp": prox})
    assert torch.equal(st["behave_imp_weight"], st2["behave_imp_weight"])
    with pytest.raises(ValueError, match="no model, so ppo.correction has no π_prox"):
        PPOActor(cfg).compute_loss(b)


def test_correction_acts_in_a_run_with_a_noisy_sampler(tmp_path):
    from harness.config import build_run_config
    from harness.run.loop import run

    cfg = build_run_config(
        tiny_reverse(
            2,
            rollout={"sampler_logit_noise": 1.0},
            ppo={"correction": "icepop"},
            eval={"every": 0, "n_prompts": 4},
        )
    )
    assert not cfg.ppo.use_decoupled_loss
    res = run(cfg, results_dir=tmp_path)
    assert res.status == "completed", res.reason
    h = res.history
    lo, hi = h["policy/behave_weight_min"], h["policy/behave_weight_max"]
    assert all(a < 1.0 or b > 1.0 for a, b in zip(lo, hi, strict=True)), (lo, hi)


@pytest.mark.parametrize(
    "sets,expect",
    [
        (
            ["ppo.rejection_sampling.upper=2"],
            "ppo.rejection_sampling: acts only with use_decoupled",
        ),
        (
            ["ppo.behave_imp_weight_mode=token_mask"],
            "ppo.behave_imp_weight_mode=token_mask: 'token_mask' acts only with use_decoupled_loss=true",
        ),
        (
            ["ppo.use_decoupled_loss=true", "ppo.rejection_sampling={upper: 2, agg: max}"],
            "ppo.rejection_sampling.agg 'max' has no effect at level 'token'",
        ),
    ],
)
def test_config_warnings_are_errors_on_the_command_line(sets, expect, tmp_path, runner):
    result, results = _run(runner, tmp_path, *sets)
    assert_refused(result, expect, results)


# --- the Python API: no mutated inputs, AReaL's prox_logp, no ignored group_size ----------------


def test_compute_loss_leaves_the_callers_batch_alone():
    b = _batch()
    keys = set(b)
    mean_only = PPOActor(PPOConfig(adv_norm=NormConfig(mean_level="batch", std_level=None)))
    plain = PPOActor(PPOConfig(adv_norm=None))
    la, _ = mean_only.compute_loss(b)
    assert set(b) == keys
    lb, _ = plain.compute_loss(b)
    fresh, _ = plain.compute_loss(_batch())
    assert lb.item() == pytest.approx(fresh.item(), rel=1e-6)
    assert la.item() != pytest.approx(lb.item(), rel=1e-3)


def test_decoupled_loss_reads_areal_prox_logp():
    b = _batch()
    cfg = PPOConfig(use_decoupled_loss=True)
    behaviour = torch.roll(b["logprobs"], -1, 1)
    at_behaviour, _ = PPOActor(cfg).compute_loss({**b, "prox_logp": behaviour})
    plain, _ = PPOActor(PPOConfig()).compute_loss(b)
    assert at_behaviour.item() == pytest.approx(plain.item(), rel=1e-6)
    moved, _ = PPOActor(cfg).compute_loss({**b, "prox_logp": behaviour - 0.5})
    assert moved.item() != pytest.approx(plain.item(), rel=1e-3)
    with pytest.raises(ValueError, match="no model, so use_decoupled_loss has no π_prox"):
        PPOActor(cfg).compute_loss(b)
    with pytest.raises(ValueError, match=r"batch\['prox_logp'\] \(π_prox\) is used only with"):
        PPOActor(PPOConfig()).compute_loss({**b, "prox_logp": behaviour})


def test_group_size_that_disagrees_with_the_batch_groups_follows_areal_and_warns_once(
    monkeypatch,
):
    # AReaL main takes the slices from the batch's group_sizes and ignores group_size; the
    # harness computes the same numbers and says so once, for the reader who expected slices.
    monkeypatch.setattr(normalization, "_warned_group_size", False)
    b = _batch()
    norm = NormConfig(mean_level="group", std_level="group", group_size=512)
    default = NormConfig(mean_level="group", std_level="group")
    with pytest.warns(UserWarning, match=r"group_size 512 differs from the batch's group_sizes"):
        lw, _ = PPOActor(PPOConfig(adv_norm=norm)).compute_loss(dict(b))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the second disagreement is silent
        lw2, _ = PPOActor(PPOConfig(adv_norm=norm)).compute_loss(dict(b))
    lb, _ = PPOActor(PPOConfig(adv_norm=default)).compute_loss(dict(b))
    assert lw.item() == pytest.approx(lb.item(), rel=1e-6)
    assert lw2.item() == pytest.approx(lb.item(), rel=1e-6)


# --- a metric no run can log is refused before anything trains ---------------------------------

import yaml  # noqa: E402

TINY_BASE = {
    "task": "reverse",
    "tiny": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 16},
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 3},
    "eval": {"every": 0, "n_prompts": 2},
    "threads": 1,
}


@pytest.mark.parametrize(
    "metric,over,expect",
    [
        (
            "final/eval_pass_at_k",
            {},
            "metric: 'final/eval_pass_at_k' needs eval.samples > 0 (sampled evaluation); it is 0",
        ),
        (
            "stability/mismatch_kl_k3_max",
            {"grid": {"rollout.measure_mismatch": [True, False]}},
            "needs rollout.measure_mismatch: true; it is false in cell 'measure_mismatch=False'",
        ),
        ("final/steps_to_threshold", {}, "is not logged by the training loops"),
    ],
)
def test_a_metric_no_run_can_log_is_refused_on_dry_run(metric, over, expect, tmp_path, runner):
    doc = {
        "name": "unlogged",
        "base": TINY_BASE,
        "grid": {"ppo.eps_clip": [0.1, 0.2]},
        "seeds": 1,
        "steps": 2,
        "metric": metric,
        **over,
    }
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    for extra in (["--dry-run"], []):
        r = runner.invoke(app, ["ablate", str(f), "--results-dir", str(results), *extra])
        assert_refused(r, expect, results)


def test_a_run_without_its_metric_records_why(tmp_path, runner):
    """stability/diverged_step is NaN in a run that does not diverge: the trial fails, and its
    reason says which metric had no value (it used to say nothing)."""
    import optuna

    grid = {"ppo.eps_clip": [0.2]}
    metric = "stability/diverged_step"
    f = grid_file(tmp_path / "exp.yaml", "nometric", TINY_BASE, grid, steps=1, metric=metric)
    results = tmp_path / "results"
    r = runner.invoke(app, ["ablate", str(f), "--results-dir", str(results)])
    err = r.stderr or ""
    assert "no reason recorded" not in r.output + err
    assert "stability/diverged_step is nan in this run's summary" in err, err
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(results / "optuna-journal.log"))
    )
    (trial,) = optuna.load_study(study_name="nometric", storage=storage).trials
    assert trial.user_attrs["reason"].startswith("stability/diverged_step is nan")


# --- a correction block may name a preset and refine it ----------------------------------------


def test_set_after_a_preset_refines_it():
    from harness.config import build_run_config
    from harness.ppo.corrections import PRESETS

    cfg = build_run_config({}, ["ppo.correction=token_tis", "ppo.correction.clip_max=3"])
    assert cfg.ppo.correction == PRESETS["token_tis"].correction.__class__(
        **{**vars(PRESETS["token_tis"].correction), "clip_max": 3.0}
    )
    block = build_run_config({"ppo": {"correction": {"preset": "icepop", "clip_max": 4}}})
    c = block.ppo.correction
    assert (c.weight, c.clip_min, c.clip_max, c.zero_outside) == ("token", 0.5, 4.0, True)
    # the same in an experiment grid: the axis refines the base's preset in every cell
    from harness.config.loading import apply_overrides

    base = {"ppo": {"correction": "token_tis"}}
    cell = build_run_config(apply_overrides(base, {"ppo.correction.clip_max": 5}))
    assert cell.ppo.correction.clip_max == 5.0 and cell.ppo.correction.log_clamp == 20.0
    assert base == {"ppo": {"correction": "token_tis"}}


@pytest.mark.parametrize(
    "sets,expect",
    [
        (["ppo.correction=none"], "got 'none' (no correction is null, e.g. --set ppo.correction"),
        (["ppo.correction={preset: tis}"], "ppo.correction.preset: must be one of token_tis,"),
        (
            ["ppo.correction.clip_max=3"],
            "need a weight: set weight to one of token, sequence_product, sequence_geometric",
        ),
    ],
)
def test_correction_errors_say_what_to_write(sets, expect, tmp_path, runner):
    result, results = _run(runner, tmp_path, *sets)
    assert_refused(result, expect, results)


# --- math_verify must be able to score the reference answers --------------------------------


def test_math_verify_on_answers_that_are_not_math_is_refused(tmp_path, runner):
    pytest.importorskip("math_verify")
    data = tmp_path / "capitals.jsonl"
    rows = [("France", "Paris"), ("Italy", "Rome"), ("Two plus two", "4")]
    data.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in rows))
    result, results = _run(
        runner, tmp_path, f"task=jsonl:{data}", "task_options={reward: math_verify}"
    )
    line = assert_refused(result, "task_options.reward: math_verify scores 2 of 3 checked", results)
    assert "capitals.jsonl line " in line and "use reward exact or numeric" in line


def test_math_verify_on_math_answers_is_accepted():
    pytest.importorskip("math_verify")
    import tempfile

    from harness.tasks import get_task

    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "math.jsonl"
        rows = [("half", "\\frac{1}{2}"), ("x", "x^2 + 1"), ("n", "42")]
        data.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in rows))
        task = get_task(f"jsonl:{data}", reward="math_verify", answer_format="tag")
        ex = task.held_out[0]
        assert task.score(ex, task.demonstration(ex)) == 1.0
        # bare in raw format math-verify's free-text extraction misses x^2 + 1: refused
        with pytest.raises(ValueError, match=r"scores 1 of 3 checked .* 'x\^2 \+ 1'"):
            get_task(f"jsonl:{data}", reward="math_verify")


# --- export: every setting maps or is named in a # comment, in every target ---------------------

import typing  # noqa: E402

from harness.config import RunConfig  # noqa: E402
from harness.core.fields import declared_fields, field_defaults  # noqa: E402

# Settings that only act together with others: the walk changes them in that context.
CONTEXT = {
    # MaxRL's mean divisor replaces the std: walked on a centred, undivided block.
    "ppo.adv_norm.divide_by": {"ppo.adv_norm": {"mean_level": "group", "std_level": None}},
    "ppo.reward_norm.divide_by": {"ppo.reward_norm": {"mean_level": "group", "std_level": None}},
    "ppo.rejection_sampling.agg": {
        "ppo.use_decoupled_loss": True,
        "ppo.rejection_sampling": {"level": "sequence"},
    },
    "ppo.rejection_sampling.": {"ppo.use_decoupled_loss": True, "ppo.rejection_sampling": {}},
    "ppo.behave_imp_weight_mode": {"ppo.use_decoupled_loss": True},
    "ppo.overlong_reward_penalty": {},
    "ppo.behave_imp_weight_cap": {
        "ppo.use_decoupled_loss": True,
        "ppo.behave_imp_weight_mode": "token_mask",
    },
    "ppo.overlong_": {
        "ppo.overlong_reward_penalty": True,
        "ppo.overlong_tokens": 4,
        "ppo.overlong_penalty_factor": 1.0,
    },
    "model_options.lora.": {"model_options.lora": {}},
    "critic.": {"critic.enabled": True},
    "warm_start.": {"warm_start.steps": 10},
    "rollout.max_resample_rounds": {"rollout.zero_variance_filter": True},
    "ppo.adv_norm.": {"ppo.adv_norm": {"mean_level": "group", "std_level": "group"}},
    "ppo.reward_norm.": {"ppo.reward_norm": {"mean_level": "group", "std_level": "group"}},
    "ppo.kl_estimator": {"ppo.kl_ctl": 0.1},
    "ppo.dppo.ratio_cap": {"ppo.policy_loss": "dppo", "ppo.dppo.surrogate": "truncated_is"},
    "ppo.vespo.behaviour_weight": {"ppo.policy_loss": "vespo", "ppo.correction": "token_tis"},
    "ppo.prox_logp_method": {"ppo.use_decoupled_loss": True, "rollout.staleness": 2},
    # rollout.async: each field where it acts (alone, weight_updates in_flight or a partial
    # over_sample is refused as a setting that changes nothing)
    "rollout.asynchronous.in_flight_kv": {
        "rollout.asynchronous.max_staleness": 2,
        "rollout.asynchronous.weight_updates": "in_flight",
    },
    "rollout.asynchronous.over_sample": {
        "rollout.asynchronous.max_staleness": 2,
        "rollout.asynchronous.partial": True,
    },
    "rollout.asynchronous.max_staleness": {},
    "rollout.asynchronous.": {"rollout.asynchronous.max_staleness": 2},
}
_OBJECTIVES_WITH_OPTIONS = (
    *("cispo", "sapo", "gmpo", "clip_cov", "kl_cov", "dppo", "vespo", "m2po"),
    *("ipo", "kimi15", "topr"),
)
for _name in _OBJECTIVES_WITH_OPTIONS:
    CONTEXT[f"ppo.{_name}."] = {"ppo.policy_loss": _name}
# Changed only together with what it needs (the walk adds these to the changed config).
PARTNERS = {
    "ppo.overlong_reward_penalty": {"ppo.overlong_tokens": 4, "ppo.overlong_penalty_factor": 1.0}
}
CHANGED = {  # a valid other value where the generic rule below cannot find one
    "ppo.behave_imp_weight_cap": 3.0,
    "ppo.correction": "token_tis",
    "ppo.behave_imp_weight_mode": "token_mask",
    "ppo.rejection_sampling.lower": 0.5,
    "ppo.rejection_sampling.agg": "max",
    "ppo.overlong_reward_penalty": True,
    "ppo.overlong_tokens": 8,
    "ppo.overlong_penalty_factor": 0.5,
    "ppo.adv_norm.group_size": 4,
    "ppo.reward_norm.group_size": 4,
    "model_options.lora.target_modules": ["q_proj"],
    "model_options.dtype": "bfloat16",
    "rollout.chat_template": "auto",
    "rollout.max_prompt_tokens": 64,
    "ppo.eps_clip_higher": 0.3,
    "ppo.c_clip": 3.0,
    "ppo.loss_agg_mode": "seq-mean-token-sum",
    "ppo.policy_loss": "cispo",
    "optim.schedule": "cosine",
    "optim.grad_clip": 0.5,
    "rollout.top_p": 0.9,
    "rollout.asynchronous.over_sample": 2.0,
}


def _other_value(path: str, tp, default):
    if path in CHANGED:
        return CHANGED[path]
    base = typing.get_args(tp)[0] if type(None) in typing.get_args(tp) else tp
    if typing.get_origin(base) is typing.Literal:
        return next(v for v in typing.get_args(base) if v != default and v is not None)
    if base is bool:
        return not default
    if base is int:
        return (default or 1) + 1
    if base is float:
        return 0.5 if default in (None, 0.0) else default * 0.5
    raise AssertionError(f"{path}: give a changed value in CHANGED ({tp!r})")


def _in_context(path: str) -> dict:
    return next((over for prefix, over in CONTEXT.items() if path.startswith(prefix)), {})


def _named(path: str, text: str) -> bool:
    notes = " ".join(ln for ln in text.splitlines() if ln.startswith("#"))
    parent = path.rsplit(".", 1)[0]
    return path in notes or (parent.count(".") >= 1 and parent in notes)


def _value_at(cfg, path: str):
    from harness.core.configtools import flatten, to_dict

    return flatten(to_dict(cfg)).get(path)


def test_every_setting_maps_or_is_named_by_every_target():
    """Walk every config field: changed (in the context it acts in), each target's export
    either writes something different or names the field in a # comment."""
    from harness.config import build_run_config
    from harness.config.loading import apply_overrides
    from harness.peers.export import TARGETS
    from harness.sweep.present.cell_export import NOT_EXPORTED, export_cell

    types = declared_fields(RunConfig)
    unaccounted, walked = [], 0
    for path, default in field_defaults(RunConfig).items():
        if any(path == k or (k.endswith(".") and path.startswith(k)) for k in NOT_EXPORTED):
            continue
        context = _in_context(path)
        tp = types[path][0] if path in types else typing.Any
        before = build_run_config(apply_overrides({}, context))
        now = _value_at(before, path)
        value = _other_value(path, tp, now if now is not None else default)
        changed = {**context, path: value, **PARTNERS.get(path, {})}
        after = build_run_config(apply_overrides({}, changed))
        assert _value_at(after, path) != now or path == "ppo.correction", path
        walked += 1
        for target in TARGETS:
            a, b = export_cell(before, target), export_cell(after, target)
            if a == b and not _named(path, b):
                unaccounted.append(f"{target}: {path}")
    assert walked > 80
    assert not unaccounted, unaccounted


def test_an_experiment_refines_a_preset_on_an_axis_and_in_a_variant(tmp_path):
    """What docs/corrections.md promises for an experiment file: a grid axis over a preset's key
    and a variant that names a preset and changes one of its keys. Both were refused as "not a
    run-config path" (the path check did not look inside the preset-or-block field)."""
    from harness.config.experiment import load_experiment
    from harness.sweep.scheduler.spec import StudySpec

    path = tmp_path / "refine.yaml"
    path.write_text(
        "name: refine\n"
        "base: {ppo: {use_decoupled_loss: true, correction: token_tis}}\n"
        "grid:\n"
        "  ppo.correction.clip_max: [2, 3]\n"
        "  variant:\n"
        "    tis: {}\n"
        "    geo: {ppo.correction: seq_tis, ppo.correction.weight: sequence_geometric}\n"
        "seeds: 1\nsteps: 2\n"
    )
    study = StudySpec.from_experiment(load_experiment(path))
    got = {}
    for cell in study.cells:
        c = study.cell_config(cell, 0).ppo.correction
        got[cell] = (c.weight, c.clip_max, c.log_clamp)
    assert sorted(got.values()) == [
        ("sequence_geometric", 2.0, 20.0),
        ("sequence_geometric", 3.0, 20.0),
        ("token", 2.0, 20.0),
        ("token", 3.0, 20.0),
    ]
