"""An error is not a divergence.  Divergence is a run's numbers stopping being finite (NaN/Inf
logits, loss, gradients or weights): a result, final, never retried.  An out-of-memory, a device
or a library error while sampling or updating is an error: the run raises, its MLflow run ends
FAILED with the reason, and a sweep retries the trial under ``--max-retries`` and reports it as
an error.  Both trainers (the harness loop and TRL's GRPOTrainer)."""

from __future__ import annotations

import io
import math
import random
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
import yaml
from rich.console import Console

import harness.run.loop as train_mod
import harness.sampling.local as sampler_mod  # the rollout function the loop's sampler calls
from harness.config import build_run_config
from harness.run.scaffold import is_numeric_overflow
from harness.run.tracked import tracked_run
from harness.run.trainers import train
from harness.sampling.base import NonFiniteLogits
from harness.sampling.local import sample as real_sample
from harness.tracking import MemoryTracker
from tests.support.studies import open_test_study
from tests.support.tiny import TINY, tiny_reverse

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "smoke.yaml"
GROUP = {"mean_level": "group", "std_level": "group"}

# What a GPU or the allocator raises mid-run; none of them says anything about the numbers.
FAULTS = [
    pytest.param(lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                 "OutOfMemoryError", id="cuda-oom"),
    pytest.param(lambda: MemoryError("cannot allocate the KV cache"), "MemoryError", id="oom"),
    pytest.param(lambda: RuntimeError("CUDA error: an illegal memory access was encountered"),
                 "RuntimeError", id="device-error"),
    pytest.param(lambda: RuntimeError("Inference tensors cannot be saved for backward"),
                 "RuntimeError", id="inf-inside-a-word"),
]  # fmt: skip


def cfg(trainer: str = "harness", **over: Any) -> Any:
    ppo = {"ppo_n_minibatches": 2}
    if trainer == "trl":
        ppo = {"ppo_n_minibatches": 2, "ppo_epochs": 1, "reward_norm": GROUP}
    base = tiny_reverse(3, trainer=trainer, ppo=ppo, eval={"every": 0, "n_prompts": 2})
    return build_run_config(base, over)


def _fail_sampling_at(step: int, make_error: Any) -> Any:
    """``harness.sampling.local.sample`` that raises ``make_error()`` on training step ``step``'s rollout
    (greedy evaluations pass through untouched)."""
    calls = {"n": 0}

    def sample(*args: Any, **kw: Any) -> Any:
        if not kw.get("greedy"):
            calls["n"] += 1
            if calls["n"] == step + 1:
                raise make_error()
        return real_sample(*args, **kw)

    return sample


# ------------------------------------------------------------------ the harness loop


@pytest.mark.parametrize(("make_error", "name"), FAULTS)
def test_an_error_while_sampling_raises_and_is_never_a_divergence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_error: Any, name: str
) -> None:
    monkeypatch.setattr(sampler_mod, "sample", _fail_sampling_at(1, make_error))
    tracker = MemoryTracker()
    with pytest.raises(BaseException) as info:
        tracked_run(cfg(), tracker, experiment="e", run_name="r", results_dir=tmp_path)
    assert type(info.value).__name__ == name
    (run,) = tracker.runs.values()
    assert run.status == "FAILED"
    assert run.tags["run.status"] == "failed"  # not "diverged"
    assert run.tags["run.reason"].startswith(f"{name}: ")
    assert "diverged" not in run.tags["run.reason"]
    assert len(run.metrics["objective/reward"]) == 1  # the step before the fault was logged


def test_nan_weights_while_sampling_are_a_divergence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real path: the policy's weights become NaN, torch.multinomial refuses the
    probabilities, and the run is diverged at that step (a result, with the metrics so far)."""
    calls = {"n": 0}

    def sample(model: Any, *args: Any, **kw: Any) -> Any:
        if not kw.get("greedy"):
            calls["n"] += 1
            if calls["n"] == 2:
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(math.nan)
        return real_sample(model, *args, **kw)

    monkeypatch.setattr(sampler_mod, "sample", sample)
    res = train_mod.run(cfg(), results_dir=tmp_path)
    assert res.status == "diverged", res.reason
    assert res.reason.startswith("diverged at step 1: non-finite probabilities while sampling")
    assert res.steps_done == 1 and len(res.history["objective/reward"]) == 1


def test_the_sampler_tells_nonfinite_logits_from_other_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from harness.model.build import load_model_and_tokenizer
    from harness.tasks import get_task

    model, tok = load_model_and_tokenizer("tiny", seed=0, device="cpu", tiny=cfg().tiny)
    prompts = [e.prompt for e in get_task("reverse").sample(random.Random(0), 2)]
    kw = {"n_samples": 2, "max_new_tokens": 3}
    real_sample(model, tok, prompts, generator=torch.Generator().manual_seed(0), **kw)

    def broken(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(torch, "multinomial", broken)
    with pytest.raises(RuntimeError, match="device-side assert"):  # finite logits: as raised
        real_sample(model, tok, prompts, generator=torch.Generator().manual_seed(0), **kw)
    monkeypatch.undo()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(math.inf)
    with pytest.raises(NonFiniteLogits, match="non-finite logits at new token 0"):
        real_sample(model, tok, prompts, generator=torch.Generator().manual_seed(0), **kw)


def test_an_update_error_is_a_divergence_only_when_it_reports_a_nonfinite_number() -> None:
    assert is_numeric_overflow(
        RuntimeError("value cannot be converted to type float without overflow")
    )
    assert is_numeric_overflow(RuntimeError("probability tensor contains either `inf`, `nan`"))
    assert is_numeric_overflow(RuntimeError("Function 'MulBackward0' returned nan values"))
    for err in (
        RuntimeError("Inference tensors cannot be saved for backward"),
        RuntimeError("Expected all tensors to be on the same device (information below)"),
        torch.OutOfMemoryError("CUDA out of memory; nan inf overflow"),
        MemoryError("overflow"),
        RuntimeError(""),
    ):
        assert not is_numeric_overflow(err), err


def test_an_out_of_memory_in_the_update_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.ppo.actor import PPOActor

    def oom(self: Any, batch: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")

    monkeypatch.setattr(PPOActor, "ppo_update", oom)
    with pytest.raises(torch.OutOfMemoryError):
        train_mod.run(cfg(), results_dir=tmp_path)


# ------------------------------------------------------------------ TRL's GRPOTrainer


@pytest.mark.parametrize(("make_error", "name"), FAULTS[:3])
def test_trl_an_error_while_sampling_raises_and_is_never_a_divergence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_error: Any, name: str
) -> None:
    from trl import GRPOTrainer

    def generate(self: Any, inputs: Any) -> Any:
        raise make_error()

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", generate)
    tracker = MemoryTracker()
    with pytest.raises(BaseException) as info:
        tracked_run(cfg("trl"), tracker, experiment="e", run_name="r", results_dir=tmp_path)
    assert type(info.value).__name__ == name
    (run,) = tracker.runs.values()
    assert run.status == "FAILED" and run.tags["run.status"] == "failed"
    assert run.tags["run.reason"].startswith(f"{name}: ")


def test_trl_nan_weights_while_sampling_are_a_divergence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trl import GRPOTrainer

    real = GRPOTrainer._generate_and_score_completions
    calls = {"n": 0}

    def generate(self: Any, inputs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.fill_(math.nan)
        return real(self, inputs)

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", generate)
    res = train(cfg("trl"), results_dir=tmp_path)
    assert res.status == "diverged", res.reason
    assert res.reason.startswith("diverged at step 1: non-finite policy parameters while sampling")
    assert res.steps_done == 1


# ------------------------------------------------------------------ in a sweep


def test_a_sampling_error_in_a_sweep_is_retried_and_ends_as_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real worker loop (in this process, so that the fault can be injected), a journal
    study with --max-retries 1: the trial runs twice, both attempts end FAIL with outcome
    'error' and the MemoryError as reason (never 'diverged'), each MLflow run FAILED with it,
    the other cell completes, and the progress display prints the reason."""
    from mlflow.tracking import MlflowClient

    from harness.sweep.launching.worker import WorkerOptions, worker_loop
    from harness.sweep.present.progress import SweepProgress
    from harness.sweep.stores.storage import make_storage

    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(name="oom", seeds=1, steps=2, grid={"rollout.n_samples": [2, 4]})
    doc.pop("baseline", None)
    path = tmp_path / "oom.yaml"
    path.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    study, spec = open_test_study(path, results, max_retries=1)

    def sample_for(n_samples: int) -> Any:
        def sample(*args: Any, **kw: Any) -> Any:
            if not kw.get("greedy") and kw.get("n_samples") == n_samples:
                raise MemoryError("cannot allocate the KV cache")
            return real_sample(*args, **kw)

        return sample

    monkeypatch.setattr(sampler_mod, "sample", sample_for(4))  # the n_samples=4 cell only
    events: list[dict[str, Any]] = []
    out = io.StringIO()
    progress = SweepProgress(1, total=2, done=0, console=Console(file=out, width=200))
    with progress:

        def emit(e: dict[str, Any]) -> None:
            events.append(e)
            progress.handle(e)

        counts = worker_loop(
            WorkerOptions(study=study.study_name, storage=None, results_dir=results), emit=emit
        )
    assert counts["error"] == 2 and counts["completed"] == 1 and counts["diverged"] == 0, counts

    trials = optuna.load_study(study_name="oom", storage=make_storage(None, results)).trials
    bad = sorted(
        (t for t in trials if t.user_attrs["cell"] == "n_samples=4"),
        key=lambda t: int(t.user_attrs.get("attempt", 0)),
    )
    assert [int(t.user_attrs.get("attempt", 0)) for t in bad] == [0, 1]
    for t in bad:
        assert t.state.name == "FAIL" and t.user_attrs["outcome"] == "error"
        assert t.user_attrs["reason"] == "MemoryError: cannot allocate the KV cache"
    (good,) = (t for t in trials if t.user_attrs["cell"] == "n_samples=2")
    assert good.state.name == "COMPLETE"

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name("oom")
    runs = [
        r
        for r in client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
        if r.data.tags.get("ablation.cell") == "n_samples=4"
    ]
    assert len(runs) == 2 and "RUNNING" not in {r.info.status for r in runs}
    last = runs[0]  # the retry's run (the first attempt's run is the retry bookkeeping's)
    assert last.info.status == "FAILED" and last.data.tags["run.status"] == "failed"
    assert last.data.tags["run.reason"] == "MemoryError: cannot allocate the KV cache"

    done = [e for e in events if e["event"] == "done" and e["outcome"] == "error"]
    assert len(done) == 2 and all("MemoryError" in e["reason"] for e in done)
    printed = out.getvalue()
    assert printed.count("(n_samples=4 seed=0): error: MemoryError: cannot allocate") == 2


def test_harness_run_prints_an_oom_as_one_line_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the CLI: the reason on one line, exit 1 (a failed run, not bad input), no
    traceback, and the MLflow run ended FAILED with that reason."""
    from typer.testing import CliRunner

    from harness.cli import app
    from harness.ppo.actor import PPOActor

    def oom(self: Any, batch: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB\nmore")

    monkeypatch.setattr(PPOActor, "ppo_update", oom)
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "steps": 2,
                "task": "reverse",
                "tiny": TINY,
                "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 4},
                "eval": {"every": 0, "n_prompts": 2},
                "warm_start": {"steps": 0},
            }
        )
    )
    results = tmp_path / "results"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = CliRunner().invoke(
        app,
        ["run", str(config), "--results-dir", str(results), "--tracking-uri", uri],
    )
    assert r.exit_code == 1, r.output
    lines = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert lines == [
        "error: run FAILED: OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"
    ]
    assert "Traceback" not in r.output
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("harness-run").experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags["run.reason"].startswith("OutOfMemoryError: CUDA out of memory")
