"""``trainer: trl`` with ``rollout.sampler_backend: vllm``: TRL's own colocated vLLM engine
(harness/run/trl_engine.py) — the option mapping, the refusals, TRL's import warning, and real
runs whose TRL importance-sampling metrics come from the engine's log-probs.

The runs start an engine each (seconds idle, a minute or more on a loaded 2-core machine), so
they are slow-marked and skip where the engine is not installed."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.config import ConfigError, build_run_config
from harness.model.engine_support import engine_installed
from harness.peers.trl import grpo_kwargs, trl_problems
from tests.support.cli import invoke_run
from tests.support.tiny import tiny_reverse

ROOT = Path(__file__).resolve().parents[2]
GROUP = {"mean_level": "group", "std_level": "group"}
needs_engine = pytest.mark.skipif(
    not engine_installed(), reason="vllm not installed (python tools/install_engine.py)"
)


def cfg(**over):
    ppo = {"ppo_n_minibatches": 1, "reward_norm": GROUP}
    base = tiny_reverse(2, trainer="trl", ppo=ppo, eval={"every": 0})
    return build_run_config(base, over)


# ---- the mapping (no engine needed)


def test_the_engine_backend_maps_to_trls_colocated_vllm():
    kw = grpo_kwargs(cfg(**{"rollout.sampler_backend": "vllm"}))
    assert kw["use_vllm"] is True and kw["vllm_mode"] == "colocate"
    assert kw["vllm_gpu_memory_utilization"] == 0.3
    # No correction configured: TRL's default (a sequence_mask weight) must not act.
    assert kw["vllm_importance_sampling_correction"] is False
    assert "use_vllm" not in grpo_kwargs(cfg())


def test_an_is_correction_reaches_trl_only_with_the_engine():
    kw = grpo_kwargs(cfg(**{"rollout.sampler_backend": "vllm", "ppo.correction": "token_tis"}))
    assert kw["vllm_importance_sampling_correction"] is True
    assert kw["vllm_importance_sampling_mode"] == "token_truncate"
    with pytest.raises(ConfigError, match=r"^ppo\.correction\.weight: .*sampler_backend: vllm"):
        cfg(**{"ppo.correction": "token_tis"})


def test_the_export_of_an_engine_cell_runs_trls_vllm_path_without_the_caveat():
    from harness.peers.export import export_trl

    over = {"ppo.reward_norm": GROUP, "ppo.correction": "token_tis"}
    with_engine = export_trl(build_run_config({}, {**over, "rollout.sampler_backend": "vllm"}))
    assert "use_vllm=True" in with_engine and "vllm_mode='colocate'" in with_engine
    assert "vllm_importance_sampling_mode='token_truncate'" in with_engine
    assert "take effect only with" not in with_engine
    # Without the engine the IS settings are exported with the condition they need.
    assert "take effect only with" in export_trl(build_run_config({}, over))


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_the_harness_decoders_are_refused_under_trl(backend):
    with pytest.raises(ConfigError, match=r"^rollout\.sampler_backend: not expressible"):
        cfg(**{"rollout.sampler_backend": backend})


def test_the_sampler_dtype_is_the_engines_under_trl():
    c = cfg(**{"rollout.sampler_backend": "vllm", "rollout.sampler_dtype": "bfloat16"})
    assert "rollout.sampler_dtype" not in [f for f, _ in trl_problems(c)]
    with pytest.raises(ConfigError, match=r"^rollout\.sampler_dtype: "):
        cfg(**{"rollout.sampler_dtype": "bfloat16"})


def test_the_cli_refuses_a_harness_decoder_under_trl_in_one_line(tmp_path):
    results = tmp_path / "results"
    r = invoke_run(
        results,
        "trainer=trl",
        "rollout.sampler_backend=fast",
        "ppo.reward_norm.mean_level=group",
        "ppo.reward_norm.std_level=group",
    )
    err = r.stderr if r.stderr is not None else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and "rollout.sampler_backend=fast: not expressible" in lines[0], lines
    assert "Traceback" not in r.output
    assert not results.exists()


@pytest.mark.slow  # 30+ s: a whole sweep or several processes
@needs_engine
def test_importing_trl_through_the_trainer_does_not_warn_about_the_vllm_version():
    """TRL warns at import that the installed vLLM is newer than it was tested with; the trainer
    imports it with that warning filtered (a fresh interpreter: TRL is imported once)."""
    code = "\n".join(
        [
            "import warnings",
            "warnings.simplefilter('default')",
            "import harness.run.trl_trainer",
            # TRL's check itself still warns (so the test can fail): asked again, unfiltered.
            "from trl.import_utils import is_vllm_available",
            "with warnings.catch_warnings(record=True) as seen:",
            "    warnings.simplefilter('always')",
            "    is_vllm_available()",
            "assert any('TRL currently supports vLLM' in str(w.message) for w in seen)",
        ]
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "TRL currently supports vLLM versions" not in out.stderr, out.stderr[-2000:]


# ---- real runs on the engine


def _engine_run(tmp_path: Path, *sets: str) -> dict[str, list[float]]:
    """`harness run` with trainer: trl on the engine; the history of the logged metrics."""
    args = ["run"]
    for s in (
        "trainer=trl",
        "rollout.sampler_backend=vllm",
        "ppo.correction=token_tis",
        "steps=2",
        "eval.every=0",
        "threads=1",
        "rollout.prompts_per_step=2",
        "rollout.n_samples=2",
        "rollout.max_new_tokens=6",
        "ppo.reward_norm.mean_level=group",
        "ppo.reward_norm.std_level=group",
        *sets,
    ):
        args += ["--set", s]
    results = tmp_path / "results"
    r = CliRunner().invoke(app, [*args, "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    assert "TRL currently supports vLLM versions" not in r.output
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED"
    keys = [
        "mismatch/logprob_abs_diff_mean",
        "mismatch/logprob_abs_diff_max",
        "policy/behave_weight_mean",
        "policy/behave_weight_min",
        "policy/behave_weight_max",
        "perf/weight_sync_s",
    ]
    hist = {k: [m.value for m in client.get_metric_history(run.info.run_id, k)] for k in keys}
    for k, v in hist.items():
        assert len(v) == 2 and all(math.isfinite(x) for x in v), (k, v)
    return hist


@pytest.mark.slow
@needs_engine
def test_trl_on_a_float32_engine_matches_the_learner(tmp_path):
    """TRL's engine at float32 (the run's dtype, not vLLM's bfloat16 default for a float32
    checkpoint): its log-probs equal the learner's to float32 precision, so ρ ≈ 1."""
    h = _engine_run(tmp_path)
    assert max(h["mismatch/logprob_abs_diff_max"]) < 1e-5, h
    assert all(abs(w - 1) < 1e-5 for k in h if "behave_weight" in k for w in h[k]), h
    assert all(s > 0 for s in h["perf/weight_sync_s"])  # synced before each generation


@pytest.mark.slow
@needs_engine
def test_trl_on_a_bfloat16_engine_weights_by_a_real_mismatch(tmp_path):
    """A bfloat16 engine under a float32 learner: TRL's token IS weights are computed from a
    real gap (not all 1) and truncated at the preset's cap."""
    h = _engine_run(tmp_path, "rollout.sampler_dtype=bfloat16")
    assert min(h["mismatch/logprob_abs_diff_mean"]) > 1e-4, h
    assert max(h["mismatch/logprob_abs_diff_max"]) > 1e-3, h
    assert min(h["policy/behave_weight_min"]) < 1 - 1e-4, h
    assert max(h["policy/behave_weight_max"]) > 1 + 1e-4, h
    assert max(h["policy/behave_weight_max"]) <= 2.0 + 1e-6  # token_tis caps ρ at 2


@pytest.mark.slow
@needs_engine
def test_trl_on_the_engine_is_reproducible(tmp_path):
    """Two runs of one seed on TRL's engine log the same metrics (the engine samples from the
    run's seed, set when it starts), and the second run in the process forms its own
    one-process group (the first one's was undone)."""
    from harness.run.trainers import train

    def history() -> dict[str, list[float]]:
        c = cfg(
            **{
                "rollout.sampler_backend": "vllm",
                "rollout.max_new_tokens": 8,
                # head size 32: one the CPU engine's attention takes
                "tiny.hidden_size": 64,
                "tiny.num_heads": 2,
            }
        )
        res = train(c)
        assert res.status == "completed", res.reason
        return res.history

    a, b = history(), history()
    keys = ["rollout/response_length", "objective/reward", "policy/entropy", "policy/loss"]
    assert all(a[k] == b[k] for k in keys), {k: (a[k], b[k]) for k in keys}


@needs_engine
def test_the_engine_trl_builds_gets_the_runs_dtype_and_seed(monkeypatch):
    """TRL passes no dtype (vLLM's auto would run a float32 checkpoint in bfloat16) and seeds
    the engine with the process index; the trainer's wrapper overrides both, and turns off the
    load's progress bar (one per run on a sweep's console)."""
    import trl.generation.vllm_generation as trl_vllm

    from harness.run.trl_engine import _engine_args

    seen: list[dict] = []
    monkeypatch.setattr(trl_vllm, "LLM", lambda *a, **kw: seen.append(kw))
    with _engine_args("float32", 7):
        trl_vllm.LLM(model="m", seed=0, gpu_memory_utilization=0.3)
    trl_vllm.LLM(model="m", seed=0)  # restored afterwards
    assert seen[0] == {
        "model": "m",
        "seed": 7,
        "dtype": "float32",
        "gpu_memory_utilization": 0.3,
        "use_tqdm_on_load": False,
    }
    assert seen[1] == {"model": "m", "seed": 0}


@pytest.mark.slow
@needs_engine
def test_trl_on_the_engine_under_lora_syncs_the_merged_weights(tmp_path):
    """LoRA adapters trained by the warm start and moved again by a large learning rate: before
    each generation TRL's engine gets the merged weights W + (alpha/r)·B·A, so its log-probs equal
    the learner's to float32 precision. (Synced with the base weights only, the same run showed
    a largest gap of 0.57 at both steps.)"""
    h = _engine_run(
        tmp_path,
        "model_options.lora.r=4",
        "model_options.lora.alpha=8",
        "optim.lr=0.05",
        "warm_start.steps=60",  # rewards above 0, so the update moves the adapters
        "rollout.n_samples=4",
        "tiny.hidden_size=64",  # head size 32: one the CPU engine's attention takes
        "tiny.num_heads=2",
    )
    assert max(h["mismatch/logprob_abs_diff_max"]) < 1e-5, h
    assert all(s > 0 for s in h["perf/weight_sync_s"])


@pytest.mark.slow
@needs_engine
def test_trl_on_the_engine_trains_phi(tmp_path):
    """Phi is served through vLLM's Transformers backend, which decorates the ``transformers``
    class the learner TRL trains is an instance of: the run used to die at the learner's first
    forward ('PhiModel' object has no attribute 'do_not_compile'). It completes, and the engine's
    log-probs equal the learner's to float32 precision."""
    from tests.support.hf_archs import build_bpe_tokenizer, save_engine_arch

    path = save_engine_arch("phi", tmp_path, build_bpe_tokenizer())
    h = _engine_run(tmp_path, f"model={path}")
    assert max(h["mismatch/logprob_abs_diff_max"]) < 1e-5, h
