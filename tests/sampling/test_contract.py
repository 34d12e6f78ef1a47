"""One contract, every sampler backend: the suite below runs over each backend the registry lists
(:mod:`harness.sampling.registry`); the engine is skipped only where vLLM is not installed.

A new backend is one file in ``harness/sampling/`` plus its entry in ``MAKE`` (how to build it on
the tiny model's CPU).  What is held to one behaviour: the ``RolloutBatch`` layout and its groups,
EOS and stop ids, prompt truncation and chat templates, log-probs equal to the learner's at fp32
(T = 1 and T ≠ 1), seeded reproducibility and a sync changing the tokens, per-token versions,
one copy per version, ``close`` twice, greedy evaluation through the backend giving the local
decoder's answers, a local run after a run of the backend in the same process logging a fresh
process's numbers, and a backend's failure ending a run as FAILED with its reason."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
from harness.run.tracked import tracked_run
from harness.sampling import BACKENDS, Sampler, SamplingParams, encode_prompts
from harness.sampling.local import LocalSampler
from harness.sampling.vllm import EngineSampler, EngineSpec
from harness.tracking import MemoryTracker

CPU = torch.device("cpu")
PROMPTS = ["rev 1=", "rev 123456789=", "12+3="]  # different lengths: real left padding
MAKE: dict[str, Callable[[dict[str, Any]], Sampler]] = {
    "local": lambda kw: LocalSampler(CPU, sample_kw=kw),
    "vllm": lambda kw: EngineSampler(CPU, EngineSpec(dtype="float32"), sample_kw=kw),
}
AVAILABLE = {"local": True, "vllm": engine_installed()}


def _param(name: str) -> Any:
    skip = pytest.mark.skipif(not AVAILABLE[name], reason=f"{name}: not installed here")
    return pytest.param(name, marks=[skip], id=name)


NAMES = [_param(n) for n in sorted(BACKENDS)]


def test_every_registered_backend_has_an_entry_in_this_suite() -> None:
    assert set(BACKENDS) == set(MAKE) == set(AVAILABLE)
    for b in BACKENDS.values():
        assert issubclass(b.cls, Sampler) and b.options
        # Each declared option is a field of the backend's settings value, defaults and all.
        assert set(b.options) <= {f.name for f in dataclasses.fields(b.cls.spec_type)}, b.name
        assert b.cls(CPU).spec == b.cls.spec_type()


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    tok = build_tokenizer()
    return build_model(tok, TinyModelConfig(), seed=0).eval(), tok


@pytest.fixture(scope="module")
def samplers(tiny) -> Iterator[dict[str, Sampler]]:
    """One sampler per backend for the module (an engine start is a minute on CPU)."""
    model, tok = tiny
    made: dict[str, Sampler] = {}
    kw = {"eos_token_ids": eos_ids(model, tok), "max_positions": max_positions(model.config)}

    def get(name: str) -> Sampler:
        if name not in made:
            made[name] = MAKE[name](dict(kw))
        return made[name]

    yield _Lazy(get)
    for s in made.values():
        s.close()


class _Lazy(dict):
    def __init__(self, get: Callable[[str], Sampler]) -> None:
        super().__init__()
        self._get = get

    def __missing__(self, name: str) -> Sampler:
        return self._get(name)


def _gen(s: Sampler, tok: Any, seed: int = 0, prompts: list[str] = PROMPTS, **p: Any) -> Any:
    params = SamplingParams(**{"n_samples": 3, "max_new_tokens": 10, **p})
    return s.generate(tok, prompts, params, torch.Generator().manual_seed(seed))


def _gap(model: Any, rb: Any, temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        lp = forward_logprobs(model, rb.input_ids, rb.attention_mask, temperature=temperature)[0]
    return (rb.logprobs - lp)[rb.loss_mask.bool()].abs()


@pytest.mark.parametrize("name", NAMES)
def test_layout_groups_and_eos(name, tiny, samplers) -> None:
    model, tok = tiny
    s = samplers[name]
    s.load(model, 0)
    rb = _gen(s, tok, seed=3, max_new_tokens=24)
    n_rows = len(PROMPTS) * 3
    assert rb.input_ids.shape[0] == n_rows and rb.group_sizes == [3, 3, 3]
    assert len(rb.completions) == n_rows
    enc = encode_prompts(tok, PROMPTS)
    assert rb.prompt_width == enc["input_ids"].shape[1]
    # The prompts of a group are its prompt's, in row order.
    assert torch.equal(
        rb.input_ids[:, : rb.prompt_width], enc["input_ids"].repeat_interleave(3, dim=0)
    )
    assert torch.equal(rb.prompt_lens, enc["attention_mask"].sum(-1).repeat_interleave(3))
    eos = set(s.sample_kw["eos_token_ids"])
    for i in range(n_rows):
        n = int(rb.response_lens[i])
        body = rb.input_ids[i, rb.prompt_width : rb.prompt_width + n].tolist()
        assert all(t not in eos for t in body[:-1])  # nothing generated past the first EOS
        assert bool(rb.truncated[i]) == (body[-1] not in eos)
        assert not rb.truncated[i] or n == 24
        # masks: the response exactly; nothing recorded past it
        assert int(rb.loss_mask[i].sum()) == n
        assert torch.equal(
            rb.attention_mask[i, rb.prompt_width :], rb.loss_mask[i, rb.prompt_width :]
        )
        assert float(rb.logprobs[i, rb.prompt_width + n :].abs().sum()) == 0.0
    assert not bool(rb.truncated.all())  # some row did stop on EOS in 24 tokens


@pytest.mark.parametrize("name", NAMES)
def test_a_stop_id_ends_a_row_and_prompts_are_truncated_and_templated(name, tiny, samplers) -> None:
    model, tok = tiny
    s = samplers[name]
    s.load(model, 0)
    saved = dict(s.sample_kw)
    try:
        # Every id a stop id: each row is one token, the stop.
        s.sample_kw = {**saved, "eos_token_ids": list(range(len(tok)))}
        rb = _gen(s, tok)
        assert rb.response_lens.tolist() == [1] * 9 and not bool(rb.truncated.any())
        s.sample_kw = {**saved, "max_prompt_tokens": 4}
        rb = _gen(s, tok)
        assert int(rb.prompt_lens.max()) == 4 and rb.prompt_width == 4
        want = encode_prompts(tok, PROMPTS, 4)["input_ids"].repeat_interleave(3, dim=0)
        assert torch.equal(rb.input_ids[:, :4], want)
        template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
        s.sample_kw = {**saved, "chat_template": template}
        rb = _gen(s, tok)
        want = encode_prompts(tok, PROMPTS, None, template)["input_ids"].repeat_interleave(3, dim=0)
        assert torch.equal(rb.input_ids[:, : rb.prompt_width], want)
        assert tok.decode(want[0][want[0] != tok.pad_token_id]) == "[rev 1=]"
    finally:
        s.sample_kw = saved


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("name", NAMES)
def test_logprobs_are_the_learners_at_fp32(name, temperature, tiny, samplers) -> None:
    model, tok = tiny
    s = samplers[name]
    s.load(model, 0)
    rb = _gen(s, tok, temperature=temperature)
    gap = _gap(model, rb, temperature)
    assert gap.numel() > 20 and float(gap.max()) < 1e-4, float(gap.max())


@pytest.mark.parametrize("name", NAMES)
def test_seeded_reproducible_a_sync_changes_tokens_versions_per_token(name, tiny, samplers) -> None:
    model, tok = tiny
    s = samplers[name]
    s.load(model, 0)
    a, b = _gen(s, tok, seed=5), _gen(s, tok, seed=5)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.input_ids, _gen(s, tok, seed=6).input_ids)
    gen_pos = a.loss_mask.bool()
    assert (a.versions[gen_pos] == 0).all() and (a.versions[~gen_pos] == -1).all()
    # Other weights under a new version: copied in, sampled from, stamped with the version.
    other = build_model(tok, TinyModelConfig(), seed=1).eval()
    before = s.stats()["syncs"]
    s.load(other, 7)
    c = _gen(s, tok, seed=5)
    assert s.stats()["syncs"] == before + 1
    assert not torch.equal(a.input_ids, c.input_ids)
    assert float(_gap(other, c).max()) < 1e-4
    assert (c.versions[c.loss_mask.bool()] == 7).all()
    assert (c.versions[~c.loss_mask.bool()] == -1).all()
    s.load(model, 0)  # back for the other tests


@pytest.mark.parametrize("name", NAMES)
def test_one_copy_per_version_and_close_twice(name, tiny, samplers) -> None:
    model, tok = tiny
    s = samplers[name]
    s.load(model, 11)
    n = s.stats()["syncs"]
    for _ in range(3):  # refill rounds: the same version, no copy
        s.load(model, 11)
        _gen(s, tok, max_new_tokens=2)
    assert s.stats()["syncs"] == n
    s.load(model, 12)
    assert s.stats()["syncs"] == n + 1
    if s.copies_weights:
        assert s.stats()["sync_seconds"] > 0
    else:
        assert s.stats()["sync_seconds"] == 0.0
    s.load(model, 0)
    # A fresh sampler, closed twice, and refusing to load once closed.
    with MAKE[name](dict(s.sample_kw)) as fresh:
        pass
    fresh.close()
    with pytest.raises(RuntimeError, match="after close"):
        fresh.load(model, 0)


@pytest.mark.parametrize("name", NAMES)
def test_a_backend_failure_is_a_failed_run_with_its_reason(
    name, tmp_path: Path, monkeypatch
) -> None:
    cls = BACKENDS[name].cls

    def fails(self: Sampler, *args: Any, **kw: Any) -> Any:
        raise RuntimeError(f"{name} backend broke")

    # The weight copy as nothing (no engine start), the generation failing.
    monkeypatch.setattr(cls, "_sync", lambda self, weights: 0.0)
    monkeypatch.setattr(cls, "_generate", fails)
    backend = "vllm" if name == "vllm" else "auto"
    c = build_run_config(
        {
            "steps": 2,
            "task": "reverse",
            "tiny": {"hidden_size": 64, "num_layers": 1, "num_heads": 2, "intermediate_size": 128},
            "rollout": {
                "prompts_per_step": 2,
                "n_samples": 2,
                "max_new_tokens": 4,
                "sampler_backend": backend,
            },
            "eval": {"every": 0, "n_prompts": 2},
            "threads": 1,
        },
        {},
    )
    tracker = MemoryTracker()
    with pytest.raises(RuntimeError, match="backend broke"):
        tracked_run(c, tracker, experiment="e", run_name="r", results_dir=tmp_path)
    (run,) = tracker.runs.values()
    assert run.status == "FAILED"
    assert run.tags["run.reason"] == f"RuntimeError: {name} backend broke"


@pytest.mark.parametrize("name", NAMES)
def test_greedy_evaluation_through_the_backend_gives_the_local_decoders_answers(
    name, tiny, samplers
) -> None:
    """eval.sampler: run: the held-out evaluation sampled by the run's sampler scores what the
    local decoder's greedy answers score (fp32, the tiny model)."""
    import random

    from harness.run.scaffold import evaluate
    from harness.tasks import get_task

    model, tok = tiny
    task = get_task("reverse")
    examples = task.sample(random.Random(0), 8)
    s = samplers[name]
    kw = dict(s.sample_kw)
    common = {"max_new_tokens": 12, "device": CPU}
    local = evaluate(model, tok, task, examples, **common, **kw)
    through = evaluate(model, tok, task, examples, **common, sampler=s, version=21, **kw)
    assert through == local
    assert s.version == 21  # the evaluated weights were loaded
    # The answers themselves, not only their scores: greedy rows are the local decoder's.
    s.load(model, 21)
    params = SamplingParams(n_samples=1, max_new_tokens=12, greedy=True)
    prompts = [e.prompt for e in examples]
    rb = s.generate(tok, prompts, params, torch.Generator().manual_seed(0))
    from harness.sampling.local import sample

    ref = sample(model, tok, prompts, n_samples=1, max_new_tokens=12,
                 generator=torch.Generator(), greedy=True, **kw)  # fmt: skip
    assert rb.completions == ref.completions
    assert torch.equal(rb.input_ids, ref.input_ids)
    s.load(model, 0)


FRESH = """
import json, sys
from harness.config import build_run_config
from harness.run.trainers import train
res = train(build_run_config(json.loads(sys.argv[1])), results_dir=sys.argv[2])
assert res.status == "completed", res.reason
print(json.dumps({k: v for k, v in res.history.items() if not k.startswith("perf/")}))
"""


@pytest.mark.slow  # a fresh process, and a run of every backend
@pytest.mark.parametrize("name", NAMES)
def test_a_local_run_after_a_run_of_the_backend_gets_a_fresh_processs_numbers(
    name, tmp_path: Path
) -> None:
    """A sweep worker runs cells one after another in its process: whatever the backend of the
    cell before, a local run logs what it logs in a fresh process."""
    import json
    import subprocess
    import sys

    from harness.run.trainers import train

    local = {
        "steps": 2,
        "task": "reverse",
        "tiny": {"hidden_size": 64, "num_layers": 1, "num_heads": 2, "intermediate_size": 128},
        "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 5},
        "eval": {"every": 0, "n_prompts": 2},
        "threads": 1,
    }
    first = {**local, "rollout": {**local["rollout"], "sampler": name}}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", FRESH, json.dumps(local), str(tmp_path / "fresh")],
        capture_output=True, text=True, timeout=900, cwd=root,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    res = train(build_run_config(first), results_dir=tmp_path / "first")
    assert res.status == "completed", res.reason
    after = train(build_run_config(local), results_dir=tmp_path / "after")
    got = {k: v for k, v in after.history.items() if not k.startswith("perf/")}
    assert json.dumps(got, sort_keys=True) == json.dumps(fresh, sort_keys=True)
