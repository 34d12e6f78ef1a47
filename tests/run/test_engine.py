"""The vLLM inference engine as the rollout sampler (``rollout.sampler_backend: vllm``,
harness/sampling/vllm.py).

The engine tests share one engine per module (its start costs seconds) and skip with a reason
where the engine is not installed (``python tools/install_engine.py``; ``make test`` does it).
The config and weight tests need no engine and always run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app
from harness.config import build_run_config
from harness.model.build import TinyModelConfig, build_model, build_tokenizer
from harness.model.engine_support import engine_dtype, engine_installed
from harness.model.logprobs import forward_logprobs
from harness.sampling.vllm import EngineSampler, EngineSpec
from harness.sampling.vllm_host import engine_weights
from tests.support.cli import invoke_run
from tests.support.sampling import draw

CPU = torch.device("cpu")
PROMPTS = ["rev 1234=", "rev 98=", "rev 55501=", "rev 7="]
needs_engine = pytest.mark.skipif(
    not engine_installed(), reason="vllm not installed (python tools/install_engine.py)"
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _learner_gap(model, rb, temperature: float = 1.0) -> torch.Tensor:
    """|ℓb − ℓp| on every generated token (the learner's float32 forward; both in token
    layout)."""
    with torch.no_grad():
        lp = forward_logprobs(model, rb.input_ids, rb.attention_mask, temperature=temperature)[0]
    mask = rb.loss_mask.bool()
    return (rb.logprobs - lp)[mask].abs()


def _draw(
    sampler,
    model,
    tok,
    seed: int,
    *,
    temperature: float = 1.0,
    n: int = 4,
    new: int = 10,
    version: int = 0,
):
    return draw(
        sampler,
        model,
        tok,
        PROMPTS,
        version=version,
        n_samples=n,
        max_new_tokens=new,
        generator=torch.Generator().manual_seed(seed),
        temperature=temperature,
        top_p=1.0,
    )


# ---- no engine needed


def test_engine_dtype_follows_the_sampler_dtype_else_the_learner():
    assert engine_dtype(None, "float32") == "float32"
    assert engine_dtype(None, "bfloat16") == "bfloat16"
    assert engine_dtype("float16", "float32") == "float16"
    with pytest.raises(ValueError, match="rollout.sampler_dtype"):
        engine_dtype("float8", "float32")


@pytest.mark.parametrize(
    ("rollout", "field"),
    [({"top_p": 0.9}, "rollout.top_p"), ({"sampler_logit_noise": 0.1}, "sampler_logit_noise")],
)
def test_what_the_engine_cannot_do_is_a_config_error(rollout, field):
    with pytest.raises(Exception, match=field):
        build_run_config({"rollout": {"sampler_backend": "vllm", **rollout}})


def test_without_the_engine_the_cli_names_the_extra_and_writes_nothing(tmp_path, monkeypatch):
    import harness.config.preflight as preflight

    monkeypatch.setattr(preflight, "engine_installed", lambda: False)
    out = tmp_path / "results"
    res = invoke_run(out, "rollout.sampler_backend=vllm", "steps=1", catch_exceptions=False)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "tools/install_engine.py" in lines[0], res.output
    assert "rollout.sampler_backend" in lines[0] and "Traceback" not in res.output
    assert not out.exists()


def test_lora_engine_weights_are_the_merged_weights():
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    tok = build_tokenizer()
    base = build_model(tok, TinyModelConfig(hidden_size=32, num_heads=2, intermediate_size=64))
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"])
    )
    with torch.no_grad():  # B starts at 0: make the adapters act
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    got = engine_weights(model)
    import copy

    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(got) == set(want)
    for n, t in want.items():
        assert torch.allclose(got[n], t, atol=1e-6), n
    q = "model.layers.0.self_attn.q_proj.weight"
    unmerged = dict(model.get_base_model().named_parameters())
    assert not torch.allclose(got[q], unmerged["model.layers.0.self_attn.q_proj.base_layer.weight"])
    # The live adapters are untouched (the engine gets a merged copy).
    assert any("lora_A" in n for n, _ in model.named_parameters())


# ---- the engine (one per module)


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    model = build_model(tok, TinyModelConfig(), seed=0).eval()
    return model, tok


def _engine_sampler(device: torch.device, model, tok) -> EngineSampler:
    """A float32 engine sampler for ``model`` on ``device``, stopping at its EOS ids and its
    position limit."""
    from harness.model.build import eos_ids, max_positions

    sample_kw = {"eos_token_ids": eos_ids(model, tok), "max_positions": max_positions(model.config)}
    return EngineSampler(device, EngineSpec(dtype="float32"), sample_kw=sample_kw)


@pytest.fixture(scope="module")
def engine(tiny) -> Iterator[EngineSampler]:
    if not engine_installed():
        pytest.skip("vllm not installed (python tools/install_engine.py)")
    model, tok = tiny
    s = _engine_sampler(CPU, model, tok)
    yield s
    s.close()


@needs_engine
def test_engine_logprobs_match_the_learner_and_follow_a_weight_sync(engine, tiny):
    model, tok = tiny
    rb = _draw(engine, model, tok, seed=0)
    assert rb.input_ids.shape[0] == len(PROMPTS) * 4 and rb.group_sizes == [4] * len(PROMPTS)
    assert int(rb.response_lens.max()) <= 10 and engine.syncs == 1
    # ℓb is the learner's log_softmax(logits / T) to float32 precision, right after a sync.
    gap = _learner_gap(model, rb)
    assert gap.numel() > 20 and float(gap.max()) < 1e-5, float(gap.max())
    # The same seeds give the same tokens (per-request seeds from the run's generator).
    again = _draw(engine, model, tok, seed=0)
    assert torch.equal(rb.input_ids, again.input_ids)
    # Temperature: processed log-probs are the tempered distribution's, as the learner's.
    hot = _draw(engine, model, tok, seed=0, temperature=0.7)
    assert float(_learner_gap(model, hot, temperature=0.7).max()) < 1e-5
    # After a weight update the engine samples from the new weights.
    updated = build_model(tok, TinyModelConfig(), seed=1).eval()
    moved = _draw(engine, updated, tok, seed=0, version=1)
    assert not torch.equal(rb.input_ids, moved.input_ids)
    assert float(_learner_gap(updated, moved).max()) < 1e-5
    # One copy per version: the draws at version 0 shared the first.
    assert engine.stats()["syncs"] == 2 and engine.stats()["sync_seconds"] > 0


@needs_engine
def test_engine_stops_at_eos_like_the_local_sampler(engine, tiny):
    model, tok = tiny
    rb = _draw(engine, model, tok, seed=3, n=8, new=24)
    eos = set(engine.sample_kw["eos_token_ids"])
    for i in range(rb.batch_size):
        resp = rb.input_ids[i, rb.prompt_width :].tolist()
        n = int(rb.response_lens[i])
        body = resp[:n]
        assert all(t not in eos for t in body[:-1])
        assert bool(rb.truncated[i]) == (body[-1] not in eos)
        if bool(rb.truncated[i]):
            assert n == 24
        assert float(rb.logprobs[i, rb.prompt_width + n :].abs().sum()) == 0.0


# ---- slow: real architectures, runs, grids, failures


SHORT = {
    "steps": 3,
    "rollout": {"prompts_per_step": 4, "n_samples": 2, "max_new_tokens": 6},
    "eval": {"every": 0, "n_prompts": 4},
    "threads": 1,
}


@pytest.mark.slow
@needs_engine
def test_a_random_init_qwen2_saved_locally_matches_the_learner(tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.support.hf_archs import arch_configs, build_bpe_tokenizer

    tok = build_bpe_tokenizer()
    config = arch_configs(len(tok))["qwen2"]
    config.head_dim = 32  # a head size the engine's CPU attention kernels have
    config.num_attention_heads = config.num_key_value_heads = 2
    config.hidden_size = 64
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
    s = EngineSampler(CPU, sample_kw={"eos_token_ids": [2], "max_positions": 64})
    try:
        rb = _draw(s, model, tok, seed=0, new=8)
        assert float(_learner_gap(model, rb).max()) < 1e-5
    finally:
        s.close()


@pytest.mark.slow
@needs_engine
def test_harness_run_with_the_engine_logs_real_mismatch(tmp_path):
    from harness.run.loop import run

    cfg = build_run_config(
        {**SHORT, "rollout": {**SHORT["rollout"], "sampler_backend": "vllm", "staleness": 1}}
    )
    res = run(cfg, results_dir=tmp_path)
    assert res.status == "completed", res.reason
    h = res.history
    # One copy per weight version: a step sampled from a snapshot already loaded copies nothing.
    syncs = h["perf/weight_sync_s"]
    assert all(v >= 0 for v in syncs) and sum(v > 0 for v in syncs) >= 1
    for step in range(3):
        assert math.isfinite(h["mismatch/kl_k3"][step])
        total = h["mismatch/kl_k1"][step]
        parts = h["mismatch/numerics_kl_k1"][step] + h["mismatch/lag_kl_k1"][step]
        assert math.isclose(total, parts, rel_tol=1e-9, abs_tol=1e-15)
        assert h["mismatch/numerics_kl_k3"][step] < 1e-9  # fp32 engine vs fp32 learner
    assert h["mismatch/lag_kl_k3"][0] == 0.0  # nothing pushed yet: the current policy sampled
    assert h["rollout/staleness"][2] == 1.0  # the engine was synced from the 1-step-old snapshot


@pytest.mark.slow
@needs_engine
def test_cli_run_with_a_bf16_engine(tmp_path):
    """`harness run` as a user types it, with a bf16 engine synced from a float32 learner: it
    trains, and the console carries the run's lines, not vLLM's (no start-up INFO or load
    progress bar, none of the per-sync dtype warnings that used to repeat every step)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    sets = ["rollout.sampler_backend=vllm", "rollout.sampler_dtype=bfloat16", "steps=2"]
    sets += ["eval.every=0", "threads=1"]
    cmd = [sys.executable, "-m", "harness", "run", "--results-dir", str(tmp_path / "results")]
    for s in sets:
        cmd += ["--set", s]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert "perf/weight_sync_s" in out or "final/reward" in out, out[-2000:]
    assert "Attempted to load weight" not in out
    assert "Failed to load weights" not in out
    assert "Loading safetensors checkpoint shards" not in out  # the load's progress bar
    assert "reduce_op" not in out  # a deprecation inside vLLM's start, not the user's
    assert " INFO " not in out, [ln for ln in out.splitlines() if " INFO " in ln][:3]
    # vLLM's import-time Triton notice (a log warning) and the CPU worker's C++ stderr line
    assert "Triton is installed" not in out and "NUMA binding" not in out, out[-2000:]


def test_the_engine_logs_errors_only_unless_the_user_asks(monkeypatch):
    import logging

    from harness.model.engine_support import quiet_engine_logs

    logger = logging.getLogger("vllm")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    assert quiet_engine_logs() == {} and logger.level == logging.NOTSET  # the user's choice
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    assert quiet_engine_logs() == {"VLLM_LOGGING_LEVEL": "ERROR"}
    assert logger.level == logging.ERROR


@pytest.mark.slow
@needs_engine
def test_an_engine_that_cannot_start_fails_the_run_with_its_reason(tmp_path, monkeypatch):
    # A KV cache past the machine's memory is refused at validation (one line, exit 2); with that
    # comparison off, as on a cluster whose workers have more memory, the engine meets it.
    monkeypatch.setenv("HARNESS_MEMORY_CHECK", "off")
    res = invoke_run(
        tmp_path / "results",
        "rollout.sampler_backend=vllm",
        "rollout.engine_kv_cache_gib=4096",
        "steps=1",
        "eval.every=0",
    )
    assert res.exit_code == 1, res.output
    assert "run FAILED" in res.output and "inference engine failed to start" in res.output


@pytest.mark.slow
@needs_engine
def test_grid_over_backend_and_correction_with_two_workers(tmp_path):
    exp = Path(__file__).resolve().parents[2] / "experiments" / "engine-vs-fast.yaml"
    res = CliRunner().invoke(
        app,
        [
            "ablate",
            str(exp),
            "--workers",
            "2",
            "--results-dir",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    from tests.support.study_reads import mlflow_runs, trials

    ts = trials(tmp_path, "engine-vs-fast")
    done = [t for t in ts if t.state.name == "COMPLETE"]
    assert len({t.user_attrs["cell"] for t in done}) == 4, [t.state.name for t in ts]
    client, runs = mlflow_runs(tmp_path, "engine-vs-fast")
    engine_runs = [r for r in runs if r.data.params.get("rollout.sampler_backend") == "vllm"]
    assert len(engine_runs) == 2
    for r in engine_runs:  # real engine log-probs, synced weights, measured mismatch
        assert r.info.status == "FINISHED"
        assert r.data.metrics["perf/weight_sync_s"] > 0
        assert math.isfinite(r.data.metrics["mismatch/kl_k3"])
    assert (tmp_path / "engine-vs-fast" / "report.md").exists()
    # The engine start's warnings about vLLM's own code, which a worker used to report per cell
    assert "script_method" not in res.output and "reduce_op" not in res.output, res.output


@pytest.mark.gpu
@needs_engine
def test_engine_on_cuda_matches_the_learner():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dev = torch.device("cuda")
    tok = build_tokenizer()
    model = build_model(tok, TinyModelConfig(), seed=0).to(dev).eval()
    s = _engine_sampler(dev, model, tok)
    try:
        rb = draw(
            s,
            model,
            tok,
            PROMPTS,
            n_samples=4,
            max_new_tokens=10,
            generator=torch.Generator(device=dev).manual_seed(0),
            temperature=1.0,
            top_p=1.0,
        )
        assert float(_learner_gap(model, rb).max()) < 1e-4
    finally:
        s.close()


@needs_engine
def test_a_head_size_the_cpu_engine_cannot_serve_is_refused_before_the_run(tmp_path):
    """The CPU build's attention takes a fixed set of head sizes; width 64 over 4 heads (16) is
    not one: one line naming the fields, exit 2, nothing written (not a FAILED run at the first
    generation)."""
    out = tmp_path / "results"
    res = invoke_run(out, "rollout.sampler_backend=vllm", "tiny.hidden_size=64", "tiny.num_heads=4")
    err = res.stderr if res.stderr is not None else res.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1, lines
    assert "tiny.num_heads / tiny.hidden_size" in lines[0] and "is 16" in lines[0], lines
    assert not out.exists()
    # head size 32 (the default tiny shape) passes the same check
    from harness.config.preflight import check_engine

    check_engine(build_run_config({"rollout": {"sampler_backend": "vllm"}}), None)
