"""Sources of training–inference mismatch (rollout.sampler_dtype / sampler_logit_noise /
sampler_backend) and their measurement in a run (harness/run/sampler.py, harness/run/mismatch.py)."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app
from harness.config import RunConfig, build_run_config
from harness.metrics.mismatch import mismatch_stats
from harness.model.build import TinyModelConfig, build_model, build_tokenizer
from harness.run.loop import run
from harness.run.mismatch import MismatchProbe
from harness.run.sampler import make_sampler, sampler_autocast
from harness.sampling.local import LocalSampler, LocalSpec
from tests.support.cli import invoke_run
from tests.support.sampling import draw
from tests.support.tiny import TINY

PROMPTS = ["rev 1234=", "rev 98=", "rev 55501=", "rev 7="]
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    model = build_model(tok, TinyModelConfig(), seed=0).eval()
    return model, tok


def _pairs(sampler: LocalSampler, model, tok, seed: int = 0):
    """Two completions of each of PROMPTS, at most 8 tokens, at T = 1 (seeded)."""
    g = torch.Generator().manual_seed(seed)
    return draw(
        sampler,
        model,
        tok,
        PROMPTS,
        n_samples=2,
        max_new_tokens=8,
        generator=g,
        temperature=1.0,
        top_p=1.0,
    )


def _kl_k3(model, tok, sampler: LocalSampler, seed: int = 0, learner=None) -> float:
    """k3 KL of ``sampler``'s behaviour log-probs against the learner at ``learner`` precision."""
    rb = draw(
        sampler,
        model,
        tok,
        PROMPTS,
        n_samples=4,
        max_new_tokens=10,
        generator=torch.Generator().manual_seed(seed),
        temperature=1.0,
        top_p=1.0,
    )
    probe = MismatchProbe(device=CPU, learner=learner, temperature=1.0)
    lp = probe.learner_logprobs(model, rb)
    mask = torch.roll(rb.loss_mask, -1, -1).bool()
    return mismatch_stats(torch.roll(rb.logprobs, -1, -1), lp, mask)["mismatch/kl_k3"]


def test_sampler_dtype_maps_to_an_autocast_dtype():
    assert sampler_autocast(None, None) is None  # null = the learner's (float32: autocast off)
    assert sampler_autocast(None, torch.bfloat16) is torch.bfloat16
    assert sampler_autocast("float32", torch.bfloat16) is None
    assert sampler_autocast("bfloat16", None) is torch.bfloat16
    assert sampler_autocast("float16", None) is torch.float16
    with pytest.raises(ValueError, match="rollout.sampler_dtype"):
        sampler_autocast("float8", None)


def test_precision_orders_the_mismatch_float32_then_float16_then_bfloat16(tiny):
    model, tok = tiny
    kl = {
        d: _kl_k3(model, tok, LocalSampler(CPU, LocalSpec(dtype=sampler_autocast(d, None))))
        for d in ("float32", "float16", "bfloat16")
    }
    assert kl["float32"] <= 1e-6 and kl["float32"] < 1e-11  # float32 rounding only
    assert kl["bfloat16"] > 1e-8  # clearly non-zero: 8-bit mantissas
    assert kl["float32"] < kl["float16"] < kl["bfloat16"] / 10  # 11-bit mantissas: far less


def test_logit_noise_is_a_dose_response_knob_and_reproducible(tiny):
    model, tok = tiny
    kls = []
    for sigma in (0.0, 0.05, 0.2, 0.5):
        spec = LocalSpec(logit_noise=sigma, noise_seed=7)
        kls.append(_kl_k3(model, tok, LocalSampler(CPU, spec)))
    assert kls[0] < 1e-11
    assert kls == sorted(kls) and kls[1] > 1e-5 and kls[3] > 10 * kls[1], kls

    def noisy():
        s = LocalSampler(CPU, LocalSpec(logit_noise=0.3, noise_seed=7))
        return _pairs(s, model, tok, seed=1)

    a, b = noisy(), noisy()
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.logprobs, b.logprobs)


def test_local_sampler_from_the_config_seeds_its_noise_from_the_run_seed():
    cfg = build_run_config(
        {
            "seed": 3,
            "rollout": {
                "sampler_logit_noise": 0.1,
                "sampler_dtype": "float16",
                "sampler_backend": "hf",
            },
        }
    )
    s = make_sampler(cfg, CPU, None, {"eos_token_ids": [2]})
    assert isinstance(s, LocalSampler)
    assert s.spec.dtype is torch.float16 and s.spec.decoder == "hf" and s.spec.logit_noise == 0.1
    assert s.noise_generator is not None and s.sample_kw == {"eos_token_ids": [2]}
    again = make_sampler(cfg, CPU, None, {})
    assert torch.equal(
        torch.randn(4, generator=s.noise_generator), torch.randn(4, generator=again.noise_generator)
    )
    assert make_sampler(RunConfig(), CPU, torch.bfloat16, {}).spec.dtype is torch.bfloat16


def test_the_backends_sample_the_same_tokens(tiny):
    model, tok = tiny
    out = {}
    for backend in ("fast", "hf"):
        rb = _pairs(LocalSampler(CPU, LocalSpec(decoder=backend)), model, tok)
        out[backend] = rb
    assert torch.equal(out["fast"].input_ids, out["hf"].input_ids)
    assert (out["fast"].logprobs - out["hf"].logprobs).abs().max() < 1e-4


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_a_random_init_real_architecture_shows_the_same_ordering(arch):
    from transformers import AutoModelForCausalLM

    from tests.support.hf_archs import arch_configs, build_bpe_tokenizer

    tok = build_bpe_tokenizer()
    config = arch_configs(len(tok))[arch]
    for k in ("attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if hasattr(config, k):
            setattr(config, k, 0.0)  # the harness zeroes dropout at load
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = 2
    kl = {
        d: _kl_k3(
            model,
            tok,
            LocalSampler(CPU, LocalSpec(dtype=sampler_autocast(d, None)), {"eos_token_ids": [2]}),
        )
        for d in ("float32", "float16", "bfloat16")
    }
    assert kl["float32"] <= 1e-6 and kl["float32"] < 1e-11
    assert kl["bfloat16"] > 1e-9  # ~6e-8 measured: clearly above float32's ~4e-14
    assert kl["float16"] < kl["bfloat16"]


SHORT = {
    "steps": 3,
    "tiny": TINY,
    "rollout": {"prompts_per_step": 4, "n_samples": 2, "max_new_tokens": 6},
    "ppo": {"ppo_n_minibatches": 2},
    "eval": {"every": 0, "n_prompts": 4},
    "threads": 1,
}


def _run(tmp_path, **rollout):
    cfg = build_run_config({**SHORT, "rollout": {**SHORT["rollout"], **rollout}})
    res = run(cfg, results_dir=tmp_path)
    assert res.status == "completed", res.reason
    return res


def test_a_run_logs_the_mismatch_and_its_decomposition_under_staleness(tmp_path):
    res = _run(tmp_path, sampler_dtype="bfloat16", staleness=1)
    h = res.history
    for step in range(3):
        total = h["mismatch/kl_k1"][step]
        parts = h["mismatch/numerics_kl_k1"][step] + h["mismatch/lag_kl_k1"][step]
        assert math.isclose(total, parts, rel_tol=1e-9, abs_tol=1e-15)
        assert h["mismatch/numerics_kl_k3"][step] > 1e-9  # bf16 sampler vs f32 learner
    assert h["mismatch/lag_kl_k3"][0] == 0.0  # nothing pushed yet: sampled by the current policy
    # one update (two optimizer steps) behind: the lag dwarfs the bf16 numerics
    assert h["mismatch/lag_kl_k3"][2] > h["mismatch/numerics_kl_k3"][2]
    s = res.summary
    assert s["stability/mismatch_kl_k3_max"] >= s["stability/mismatch_kl_k3_mean"] > 0


def test_float32_run_has_no_mismatch_and_measure_off_logs_none(tmp_path):
    res = _run(tmp_path / "a", sampler_dtype="float32")
    assert max(res.history["mismatch/kl_k3"]) <= 1e-6
    assert all(v == 0.0 for v in res.history["mismatch/lag_kl_k1"])
    off = _run(tmp_path / "b", measure_mismatch=False)
    assert not any(k.startswith("mismatch/") for k in off.history)
    assert math.isnan(off.summary["stability/mismatch_kl_k3_mean"])


def _bf16_rollout(model, tok):
    """A bfloat16-sampled rollout of PROMPTS and the actor batch built from it (seeded)."""
    rb = _pairs(LocalSampler(CPU, LocalSpec(dtype=torch.bfloat16)), model, tok)
    batch = {
        "input_ids": rb.input_ids,
        "attention_mask": rb.attention_mask,
        "loss_mask": rb.loss_mask,
        "logprobs": rb.logprobs,
        "rewards": torch.rand(rb.batch_size, generator=torch.Generator().manual_seed(0)),
        "group_sizes": rb.group_sizes,
    }
    return rb, batch


def test_reusing_the_actors_recompute_measures_the_same_as_an_extra_forward(tiny):
    from harness.config import PPOActorConfig
    from harness.ppo.actor import PPOActor

    model, tok = tiny
    rb, batch = _bf16_rollout(model, tok)
    actor = PPOActor(PPOActorConfig(recompute_logprob=True), model)
    actor.compute_advantages(batch)
    reused = MismatchProbe(CPU, None, 1.0, reuse_recompute=True).measure(model, rb, batch, None)
    extra = MismatchProbe(CPU, None, 1.0).measure(model, rb, batch, None)
    assert reused.keys() == extra.keys()
    for k in reused:
        assert reused[k] == pytest.approx(extra[k], rel=1e-6, abs=1e-12), k


@pytest.mark.parametrize("minibatches", [1, 2])
def test_the_updates_first_forward_measures_what_an_extra_forward_would(tiny, minibatches):
    import copy

    from harness.config import PPOActorConfig
    from harness.ppo.actor import PPOActor

    model, tok = tiny
    model = copy.deepcopy(model)
    rb, batch = _bf16_rollout(model, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    actor = PPOActor(PPOActorConfig(ppo_n_minibatches=minibatches), model, opt)
    actor.compute_advantages(batch)
    probe = MismatchProbe(CPU, None, 1.0)
    before = probe.measure(model, rb, batch, None)  # an extra forward, before the update
    actor.ppo_update(batch)
    assert actor.first_logprobs is not None
    rows = actor.first_logprobs[0]
    got = probe.measure(model, rb, batch, None, first=actor.first_logprobs)
    if minibatches == 1:
        assert sorted(rows) == list(range(rb.batch_size))
        for k in before:
            assert got[k] == pytest.approx(before[k], rel=1e-5, abs=1e-12), k
    else:  # the first minibatch's rows only, still measured before any optimizer step
        assert 0 < len(rows) < rb.batch_size
        lp = probe.learner_logprobs(model, rb)  # after the update: differs
        assert got["mismatch/kl_k3"] > 0
        assert (
            got["mismatch/kl_k3"]
            < mismatch_stats(torch.roll(rb.logprobs, -1, -1), lp, batch["mask"])["mismatch/kl_k3"]
        )


@pytest.mark.parametrize(
    "sets,expect",
    [
        (["rollout.sampler_dtype=float8"], "rollout.sampler_dtype"),
        (["rollout.sampler_logit_noise=-0.1"], "rollout.sampler_logit_noise"),
        (["rollout.sampler_logit_noise=nan"], "rollout.sampler_logit_noise"),
        (["rollout.sampler_backend=sglang"], "rollout.sampler_backend"),
        (["rollout.measure_mismatch=maybe"], "rollout.measure_mismatch"),
    ],
)
def test_bad_sampler_values_are_one_line_naming_the_field(sets, expect, tmp_path):
    results = tmp_path / "results"
    args = ["run", "--results-dir", str(results)]
    for s in sets:
        args += ["--set", s]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    err = r.stderr if r.stderr is not None else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and expect in lines[0], lines
    assert "Traceback" not in r.output
    assert not (results / "mlflow.db").exists()


def test_trl_cannot_express_the_sampler_sources():
    from harness.peers.trl import trl_problems

    cfg = RunConfig()
    cfg.rollout.sampler_dtype, cfg.rollout.sampler_logit_noise = "float16", 0.1
    cfg.rollout.sampler_backend = "hf"
    fields = [f for f, _ in trl_problems(cfg)]
    assert {"rollout.sampler_dtype", "rollout.sampler_logit_noise"} <= set(fields)
    assert "rollout.sampler_backend" in fields
    cfg.rollout.sampler_dtype = "float32"  # = model_options.dtype: what TRL does anyway
    assert "rollout.sampler_dtype" not in [f for f, _ in trl_problems(cfg)]


def test_fast_backend_on_an_architecture_it_cannot_replay_is_refused_before_the_run(tmp_path):
    from tests.support.hf_archs import build_bpe_tokenizer, save_arch

    path = save_arch("gpt2", tmp_path, build_bpe_tokenizer())
    results = tmp_path / "results"
    r = invoke_run(results, f"model={path}", "rollout.sampler_backend=fast", env={"COLUMNS": "250"})
    err = r.stderr if r.stderr is not None else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and "rollout.sampler_backend: fast needs a Llama" in lines[0], lines
    assert not (results / "mlflow.db").exists()
