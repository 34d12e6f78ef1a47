"""Supervised warm start: it learns, and the on-disk cache is shared safely between processes."""

from __future__ import annotations

import multiprocessing as mp
import queue as queues
import time
from pathlib import Path

import pytest
import torch

from harness.model.build import build_model, build_tokenizer
from harness.run.warmstart import (
    WarmStartDiverged,
    _encode_batch,
    cached_warm_start,
    warm_start,
    weights_digest,
)
from harness.sampling.local import sample
from harness.tasks import get_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _greedy_reward(model, tok, task, n: int = 64) -> float:
    ev = task.eval_examples(n)
    batch = sample(
        model,
        tok,
        [ex.prompt for ex in ev],
        n_samples=1,
        max_new_tokens=task.max_new_tokens_hint,
        generator=torch.Generator().manual_seed(0),
        greedy=True,
    )
    return sum(task.score(ex, c) for ex, c in zip(ev, batch.completions, strict=True)) / len(ev)


def test_encode_batch_masks_only_the_completion_and_eos():
    tok = build_tokenizer()
    ids, attn, target = _encode_batch(
        tok, [("rev 12=", "21"), ("rev 1234=", "4321")], torch.device("cpu")
    )
    assert ids.shape == (2, 14)
    assert target.sum(-1).tolist() == [3.0, 5.0]  # completion + EOS
    assert ids[0, -1] == tok.eos_token_id and ids[0, :2].tolist() == [0, 0]
    assert tok.decode(ids[1][target[1].bool()]) == "4321<eos>"
    assert attn[0].tolist() == [0, 0, 0, 0] + [1] * 10


def test_warm_start_lifts_greedy_reward_on_reverse():
    """200 steps (~6 s on one core) take greedy partial credit from ~0 to about 0.45."""
    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    task = get_task("reverse")
    before = _greedy_reward(model, tok, task)
    info = warm_start(model, tok, task, steps=200, batch_size=32, lr=3e-3, seed=0)
    after = _greedy_reward(model, tok, task)
    assert before < 0.05
    assert after > 0.3 and after > before + 0.25
    assert info["loss_first"] > 4.0 and info["loss_last"] < 1.5


def test_warm_start_is_deterministic():
    tok = build_tokenizer()
    task = get_task("add")
    digests = []
    for _ in range(2):
        model = build_model(tok, seed=1)
        warm_start(model, tok, task, steps=3, batch_size=4, lr=1e-3, seed=9)
        digests.append(weights_digest(model))
    assert digests[0] == digests[1]


def _cached(
    cache_dir,
    *,
    lr=1e-3,
    seed=0,
    model_seed=0,
    task_spec="reverse",
    task_options=None,
    key_parts=None,
):
    tok = build_tokenizer()
    model = build_model(tok, seed=model_seed)
    return cached_warm_start(
        model,
        tok,
        get_task(task_spec, **(task_options or {})),
        model_spec="tiny",
        task_spec=task_spec,
        steps=4,
        batch_size=4,
        lr=lr,
        seed=seed,
        cache_dir=cache_dir,
        key_parts=key_parts,
    )


def test_cache_reuses_weights_and_key_covers_settings(tmp_path):
    m1, info1 = _cached(tmp_path)
    m2, info2 = _cached(tmp_path)
    assert info1["trained"] and not info2["trained"]
    assert info1["key"] == info2["key"] and len(info1["key"]) == 64
    assert info2["loss_first"] == info1["loss_first"]  # read back from the sidecar
    assert weights_digest(m1) == weights_digest(m2)
    assert weights_digest(m1) != weights_digest(build_model(build_tokenizer(), seed=0))
    assert Path(info1["path"]).name == f"{info1['key']}.safetensors"
    others = [
        _cached(tmp_path, lr=2e-3)[1],
        _cached(tmp_path, seed=1)[1],
        _cached(tmp_path, model_seed=1)[1],  # different initial weights
        _cached(tmp_path, task_options={"max_len": 5})[1],
        _cached(tmp_path, task_spec="sort")[1],
        _cached(tmp_path, key_parts={"x": 1})[1],
    ]
    assert len({info1["key"], *(o["key"] for o in others)}) == 1 + len(others)
    assert all(o["trained"] for o in others)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_diverged_warm_start_is_an_error_and_caches_nothing(tmp_path):
    """lr 1e30 sends the loss to NaN within a few steps: the error names the step and the
    setting to lower, and no weights are published for a later run to start from."""
    with pytest.raises(WarmStartDiverged) as err:
        _cached(tmp_path, lr=1e30)
    assert str(err.value).startswith("warm_start: the supervised warm start diverged (its loss")
    assert "of 4); lower warm_start.lr (now 1e+30). Nothing was cached." in str(err.value)
    assert not list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob("*.json"))
    assert not list(tmp_path.glob(".*.tmp"))
    _, info = _cached(tmp_path)  # a sane lr trains and publishes as usual
    assert info["trained"] and Path(info["path"]).exists()


def test_weights_left_non_finite_by_the_last_step_are_an_error(monkeypatch):
    """Every loss is computed before its step, so NaN written by the last step shows only in the
    weights."""
    real_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def step(self, *args, **kw):
        out = real_step(self, *args, **kw)
        calls["n"] += 1
        if calls["n"] == 3:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("nan"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    tok = build_tokenizer()
    with pytest.raises(WarmStartDiverged, match=r"its weights are not finite after 3 steps"):
        warm_start(
            build_model(tok, seed=0), tok, get_task("add"), steps=3, batch_size=2, lr=1e-3, seed=0
        )


N_RACERS = 2  # each spawned process imports torch + transformers (~3 s of CPU)


def _race_worker(cache_dir: str, barrier, queue) -> None:
    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    barrier.wait(timeout=600)  # a safety net: the other racer may start minutes later under load
    model, info = cached_warm_start(
        model,
        tok,
        get_task("add"),
        model_spec="tiny",
        task_spec="add",
        steps=30,
        batch_size=8,
        lr=1e-3,
        seed=0,
        cache_dir=Path(cache_dir),
    )
    queue.put((info["trained"], info["key"], weights_digest(model)))


def _gather(queue, procs, bound: float = 900) -> list:
    """One result per racer, as each arrives; fails at once when a racer dies without one. The
    bound only stops a hang: each racer imports torch and transformers and trains 30 steps,
    which takes minutes on a loaded 2-core machine."""
    deadline = time.monotonic() + bound
    results = []
    while len(results) < len(procs):
        try:
            results.append(queue.get(timeout=0.5))
        except queues.Empty:
            died = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not died, f"a racer exited with {died} before its result"
            assert time.monotonic() < deadline, f"no result from every racer within {bound} s"
    return results


@pytest.mark.slow  # 30+ s: a whole sweep or several processes
def test_concurrent_processes_train_once_and_share(tmp_path):
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(N_RACERS), ctx.Queue()
    procs = [
        ctx.Process(target=_race_worker, args=(str(tmp_path), barrier, queue), daemon=True)
        for _ in range(N_RACERS)
    ]
    for p in procs:
        p.start()
    results = _gather(queue, procs)
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    assert sorted(r[0] for r in results) == [False] * (N_RACERS - 1) + [True]  # one trained
    assert len({r[1] for r in results}) == 1 and len({r[2] for r in results}) == 1
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
