"""The vLLM engine as a step-level sampler (harness/sampling/vllm_steps.py): asynchronous rollouts
(``rollout.async``) with ``rollout.sampler_backend: vllm``.

Slow: each engine start costs seconds (the sampler tests share one engine per module; each run
starts its own). Skipped with a reason where the engine is not installed
(``python tools/install_engine.py``; ``make test`` does it).
"""

from __future__ import annotations

import gc
import math
import threading
from collections.abc import Iterator

import pytest
import torch

from harness.config import build_run_config
from harness.model.build import (
    TinyModelConfig,
    build_model,
    build_tokenizer,
    eos_ids,
    max_positions,
)
from harness.model.engine_support import engine_installed
from harness.model.logprobs import forward_logprobs
from harness.run.dynamic_sampling import concat_rollouts
from harness.run.policies import frozen_copy
from harness.sampling import SamplingParams
from harness.sampling.stepping import StepSetup
from harness.sampling.vllm import EngineHost, EngineSampler, EngineSpec
from harness.sampling.vllm_steps import EngineStepSampler, resubmit_seed
from tests.support.sampling import draw

CPU = torch.device("cpu")
PROMPTS = ["rev 1234=", "rev 98=", "rev 55501=", "rev 7="]
N, NEW = 4, 12
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not engine_installed(), reason="vllm not installed (python tools/install_engine.py)"
    ),
]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_resubmit_seeds_are_fixed_distinct_and_in_range():
    seeds = [resubmit_seed(12345, k) for k in range(1, 6)]
    assert len(set(seeds)) == 5 and 12345 not in seeds
    assert seeds == [resubmit_seed(12345, k) for k in range(1, 6)]  # a function of the two
    assert all(0 <= s < 2**31 - 1 for s in [*seeds, resubmit_seed(2**31 - 2, 7)])


# ---- the sampler on one engine (shared by the module's tests)


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    model = build_model(tok, TinyModelConfig(), seed=0).eval()
    kw = {"eos_token_ids": eos_ids(model, tok), "max_positions": max_positions(model.config)}
    return model, tok, kw


@pytest.fixture(scope="module")
def host(tiny) -> Iterator[EngineHost]:
    h = EngineHost(CPU, EngineSpec(dtype="float32", max_positions=tiny[2]["max_positions"]))
    yield h
    h.close()


def _stepper(host: EngineHost, tiny, seed: int = 0) -> EngineStepSampler:
    model, tok, kw = tiny
    params = SamplingParams(n_samples=N, max_new_tokens=NEW, temperature=1.0)
    gen = torch.Generator().manual_seed(seed)
    return EngineStepSampler(StepSetup(frozen_copy(model), tok, params, gen, kw), host=host)


def _drain(s: EngineStepSampler, *, limit: int = 10 * NEW):
    out = []
    for _ in range(limit):
        if not s.running:
            break
        out += s.step()
    assert not s.running and not s.requests, "the engine did not finish its requests"
    return out


def _learner_lp(model, rb) -> torch.Tensor:
    with torch.no_grad():
        return forward_logprobs(model, rb.input_ids, rb.attention_mask, temperature=1.0)[0]


def test_one_submit_samples_the_batch_engine_samplers_tokens_with_the_learners_logprobs(host, tiny):
    model, tok, kw = tiny
    s = _stepper(host, tiny)
    s.load(model.state_dict(), 0, recompute=False)
    s.submit(PROMPTS, [10, 11, 12, 13])
    assert s.running == 4 and len(s.requests) == 4 * N
    done = _drain(s)
    assert [f.gid for f in done] == [10, 11, 12, 13] and all(f.submitted == 0 for f in done)
    assert s.decode_steps <= NEW  # one token per running request per step
    rb = concat_rollouts([f.rb for f in done], tok.pad_token_id)
    assert rb.group_sizes == [N] * 4 and int(rb.response_lens.max()) <= NEW
    # ℓb is the learner's log_softmax(logits / T) at float32 (the engine tests' tolerance).
    mask = rb.loss_mask.bool()
    gap = (rb.logprobs - _learner_lp(model, rb))[mask].abs()
    assert gap.numel() > 40 and float(gap.max()) < 1e-5, float(gap.max())
    # Every generated token is version 0, every other position −1.
    assert rb.versions is not None
    assert bool((rb.versions[mask] == 0).all()) and bool((rb.versions[~mask] == -1).all())
    # The same generator seed through the batch engine sampler on the same engine: the same
    # rows' seeds (drawn in the same order), the same tokens and log-probs.
    batch = EngineSampler(CPU, sample_kw=kw)
    batch.host = host
    want = draw(
        batch,
        model,
        tok,
        PROMPTS,
        generator=torch.Generator().manual_seed(0),
        n_samples=N,
        max_new_tokens=NEW,
        temperature=1.0,
        top_p=1.0,
    )
    assert torch.equal(want.input_ids, rb.input_ids)
    assert torch.allclose(want.logprobs, rb.logprobs, atol=1e-6)


def _with_load(host, tiny, new_model, *, recompute: bool, at: int):
    """Sample PROMPTS, loading ``new_model`` as version 1 after ``at`` steps."""
    model, tok, _ = tiny
    s = _stepper(host, tiny)
    s.load(model.state_dict(), 0, recompute=False)
    s.submit(PROMPTS, [0, 1, 2, 3])
    done = []
    for _ in range(at):
        done += s.step()
    running = len(s.requests)
    s.load(new_model.state_dict(), 1, recompute=recompute)
    done += _drain(s)
    return concat_rollouts([f.rb for f in done], tok.pad_token_id), s, running


def test_in_flight_load_keep_and_recompute_differ_as_defined(host, tiny):
    model, tok, _ = tiny
    new = build_model(tok, TinyModelConfig(), seed=1).eval()
    at = 4
    keep, ks, k_running = _with_load(host, tiny, new, recompute=False, at=at)
    comp, cs, c_running = _with_load(host, tiny, new, recompute=True, at=at)
    assert k_running == c_running > 0  # rows still running at the load
    assert ks.resubmitted == 0 and cs.resubmitted == c_running
    w = keep.prompt_width
    # Up to the load both sampled the same tokens (same seeds, same weights), as version 0.
    assert torch.equal(keep.input_ids[:, : w + at], comp.input_ids[:, : w + at])
    for rb in (keep, comp):
        gen = rb.loss_mask.bool()
        v = rb.versions
        assert bool((v[:, w : w + at][gen[:, w : w + at]] == 0).all())
        assert bool((v[:, w + at :][gen[:, w + at :]] == 1).all())
        assert int((v == 1).sum()) > 0
    old_tok = lambda rb: (rb.versions == 0) & rb.loss_mask.bool()  # noqa: E731
    new_tok = lambda rb: (rb.versions == 1) & rb.loss_mask.bool()  # noqa: E731
    # recompute: the prefix is re-prefilled, so the new tokens' ℓb are the new weights' own
    # log-probs over the whole context; the old tokens' stay the old weights'.
    assert float((comp.logprobs - _learner_lp(new, comp))[new_tok(comp)].abs().max()) < 1e-5
    assert float((comp.logprobs - _learner_lp(model, comp))[old_tok(comp)].abs().max()) < 1e-5
    # keep: the new tokens attend to the KV the old weights computed, so they are not the new
    # weights' log-probs over the context (the stale-KV mismatch); the old tokens are untouched.
    assert float((keep.logprobs - _learner_lp(new, keep))[new_tok(keep)].abs().max()) > 1e-3
    assert float((keep.logprobs - _learner_lp(model, keep))[old_tok(keep)].abs().max()) < 1e-5
    # The resubmitted rows sample from derived seeds: the continuations differ.
    assert not torch.equal(keep.input_ids, comp.input_ids)


def test_under_lora_the_engine_samples_the_merged_adapters_it_was_loaded(host, tiny):
    pytest.importorskip("peft")
    import copy

    from peft import LoraConfig, get_peft_model

    model, tok, kw = tiny
    lora = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8))
    params = SamplingParams(n_samples=N, max_new_tokens=NEW, temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    s = EngineStepSampler(StepSetup(frozen_copy(lora), tok, params, gen, kw), host=host)
    with torch.no_grad():  # B starts at 0 (the copy's adapters do nothing): make them act
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    adapters = {n: p.detach().clone() for n, p in lora.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    s.load(adapters, 0, recompute=False)  # what an asynchronous LoRA run publishes
    s.submit(PROMPTS, [0, 1, 2, 3])
    rb = concat_rollouts([f.rb for f in _drain(s)], tok.pad_token_id)
    mask = rb.loss_mask.bool()
    assert float((rb.logprobs - _learner_lp(lora, rb))[mask].abs().max()) < 1e-5
    assert float((rb.logprobs - _learner_lp(model, rb))[mask].abs().max()) > 1e-3  # not the base


# ---- harness runs (each its own engine)

RUN = {
    "steps": 6,
    "seed": 3,
    "rollout": {
        "prompts_per_step": 4,
        "n_samples": 2,
        "max_new_tokens": 16,
        "sampler_backend": "vllm",
        "async": {"max_staleness": 2, "weight_updates": "in_flight"},
    },
    "eval": {"every": 0, "n_prompts": 4},
    "threads": 1,
}


def _run(tmp_path, *, clock: str, kv: str = "keep"):
    from harness.run.loop import run

    a = {**RUN["rollout"]["async"], "clock": clock, "in_flight_kv": kv}  # type: ignore[index]
    cfg = build_run_config({**RUN, "rollout": {**RUN["rollout"], "async": a}})
    res = run(cfg, results_dir=tmp_path)
    assert res.status == "completed", res.reason
    return res


def _alive() -> set[str]:
    """Threads, child processes and ``vllm.LLM`` objects of this process. tqdm's process-wide
    monitor thread (a daemon that ends with the last progress bar) is not the engine's. An
    engine's start freezes the collector's heap (``gc.freeze``: the objects it holds are not
    listed by ``gc.get_objects``) until its shutdown unfreezes it; unfrozen here, so that the
    module's running engine is listed too."""
    import psutil

    gc.unfreeze()
    gc.collect()
    out = {f"thread {t.ident} {t.name}" for t in threading.enumerate() if t.name != "tqdm_monitor"}
    out |= {f"process {p.pid} {p.name()}" for p in psutil.Process().children(recursive=True)}
    out |= {f"engine {id(o)}" for o in gc.get_objects() if type(o).__name__ == "LLM"}
    return out


def _leftovers(before: set[str]) -> list[str]:
    """What a run left behind: threads, processes and engines alive now that were not before
    (the module's shared engine is)."""
    return sorted(_alive() - before)


def _lags_ok(h: dict[str, list[float]], eta: int, *, mixed: bool) -> None:
    """Every token's lag within ``eta``; with ``mixed``, some sequence spans two versions.
    Whether a weight update lands mid-sequence on the threads clock depends on how the OS
    schedules the two threads (on a loaded machine the sampler can finish every sequence
    before the learner publishes), so only the virtual clock, which fixes the interleaving,
    is held to it."""
    assert all(0 <= v <= eta for v in h["async/token_lag_max"]), h["async/token_lag_max"]
    frac = h["async/mixed_version_fraction"]
    assert all(0 <= v <= 1 for v in frac), frac
    if mixed:
        assert max(frac) > 0, frac


def test_threads_clock_run_with_the_engine_keeps_lags_within_eta_and_leaves_nothing(
    tmp_path,
):
    before = _alive()
    res = _run(tmp_path, clock="threads")
    h = res.history
    assert res.steps_done == 6 and all(math.isfinite(v) for v in h["objective/reward"])
    _lags_ok(h, 2, mixed=False)
    # The step sampler's weight copies are the run's perf/weight_sync_s (one per version).
    assert all(v >= 0 for v in h["perf/weight_sync_s"]) and max(h["perf/weight_sync_s"]) > 0
    assert _leftovers(before) == []


TIMED = ("perf/", "async/sampler_idle_s", "async/learner_idle_s")


def _same(x: float, y: float) -> bool:
    return x == y or (math.isnan(x) and math.isnan(y))


def _untimed(h: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: v for k, v in h.items() if not k.startswith(TIMED)}


def test_virtual_clock_with_the_engine_reruns_bit_identically(tmp_path):
    before = _alive()
    a = _run(tmp_path / "a", clock="virtual", kv="recompute")
    b = _run(tmp_path / "b", clock="virtual", kv="recompute")
    ha, hb = _untimed(a.history), _untimed(b.history)
    assert ha.keys() == hb.keys() and "async/token_lag_mean" in ha
    diff = [k for k in ha if not all(map(_same, ha[k], hb[k]))]
    assert diff == [], {k: (ha[k], hb[k]) for k in diff[:3]}
    _lags_ok(a.history, 2, mixed=True)
    assert _leftovers(before) == []


def test_an_engine_failure_mid_run_fails_the_run_with_its_reason_and_leaves_no_engine(
    tmp_path, monkeypatch
):
    from harness.sampling.vllm_host import EngineError

    real = EngineStepSampler.step
    calls = {"n": 0}

    def failing(self):
        calls["n"] += 1
        if calls["n"] == 20:  # mid-generation, after the engine started and sampled
            raise EngineError("engine step failed: RuntimeError: the stand-in crash")
        return real(self)

    monkeypatch.setattr(EngineStepSampler, "step", failing)
    before = _alive()
    # The run ends with the engine's reason (as the sampler thread's failure, in its words).
    with pytest.raises(Exception, match="EngineError: engine step failed: .*the stand-in crash"):
        _run(tmp_path, clock="threads")
    assert calls["n"] == 20
    assert _leftovers(before) == []


def test_at_eta_0_the_virtual_clock_samples_the_synchronous_engine_runs_tokens(
    tmp_path, monkeypatch
):
    """η 0 is refused as a no-op setting; forced on, the step-level engine on the virtual clock
    reproduces the synchronous engine run exactly (the same row seeds, one submission per step,
    the same batches through the engine)."""
    from harness.config.asynchrony import AsyncConfig
    from harness.run.loop import run

    base = {**RUN, "rollout": {k: v for k, v in RUN["rollout"].items() if k != "async"}}
    base["steps"] = 3
    sync = run(build_run_config(base), results_dir=tmp_path / "sync")
    monkeypatch.setattr(AsyncConfig, "enabled", property(lambda self: True))
    forced = run(build_run_config(base), results_dir=tmp_path / "forced")
    assert sync.status == forced.status == "completed"
    assert "async/token_lag_mean" in forced.history
    hs, hf = sync.history, forced.history
    keys = [k for k in hs if not k.startswith(("perf/", "async/"))]
    assert "objective/reward" in keys and "mismatch/kl_k3" in keys
    diff = [k for k in keys if not all(map(_same, hs[k], hf[k]))]
    assert diff == [], {k: (hs[k], hf[k]) for k in diff[:3]}
