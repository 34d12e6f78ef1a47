"""Packing: several LoRA runs on one base model, stepped in turn (harness/run/packing.py).

Each trial of a pack is its unpacked run: the same metric history to 1e-5 relative on the tiny
model at fp32 (with KL to the base, a staleness ring, a cached warm start and LoRA dropout, which
draws from the global RNG, so each trial's RNG streams are load-bearing). A trial that diverges
or raises ends alone; a stop request or SIGTERM ends every trial as interrupted; configs that
cannot share a base are refused in one line naming the field."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import pytest

from harness.config import build_run_config
from harness.run.loop import run
from harness.run.packing import BASE_FIELDS, incompatible_field, pack_key, run_packed
from harness.run.tracked import signals_interrupt
from tests.support.packing import (
    HISTORY_CELLS,
    HISTORY_COMMON,
    LORA_DROPOUT,
    lora_base,
    run_pack_with_a_broken_tracker,
)
from tests.support.tiny import TINY

pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[2]


def cfg(**over):
    base = {"steps": 3, **lora_base(lora=LORA_DROPOUT, eval_every=2)}
    return build_run_config(base, over)


def assert_same_history(packed, alone, rel=1e-5):
    keys = [k for k in alone.history if not k.startswith("perf/")]
    assert keys and set(packed.history) == set(alone.history)
    for k in keys:
        a, b = alone.history[k], packed.history[k]
        assert len(a) == len(b), k
        for x, y in zip(a, b, strict=True):
            if math.isnan(x):
                assert math.isnan(y), k
            else:
                assert y == pytest.approx(x, rel=rel, abs=1e-12), k


def test_each_trial_of_a_pack_has_its_unpacked_history(tmp_path):
    cells = [cfg(**HISTORY_COMMON, **cell) for cell in HISTORY_CELLS]
    seen: list[list[int]] = [[], []]

    def hooks(i):
        return {"results_dir": tmp_path, "on_metrics": lambda step, m: seen[i].append(step)}

    packed = run_packed(cells, [hooks(0), hooks(1)])
    alone = [run(c, results_dir=tmp_path) for c in cells]
    for p, a in zip(packed, alone, strict=True):
        assert (p.status, p.steps_done) == ("completed", 3)
        assert_same_history(p, a)
        assert p.tags["warm_start.cache_key"] == a.tags["warm_start.cache_key"]
        assert p.summary["final/eval_reward"] == pytest.approx(a.summary["final/eval_reward"])
    assert seen == [[0, 1, 2], [0, 1, 2]]  # each trial's tracker saw its own steps, once
    # The two cells are two runs: their updates differ (a mix-up of adapters would show here).
    kl = [p.history["objective/kl"][-1] for p in packed]
    assert kl[0] != pytest.approx(kl[1], rel=1e-3)


def test_a_diverging_trial_ends_alone_and_the_other_stays_itself(tmp_path):
    healthy = cfg(steps=4)
    blowing = cfg(steps=4, **{"optim.lr": 1e20, "optim.grad_clip": None})
    packed = run_packed([blowing, healthy], [{"results_dir": tmp_path}] * 2)
    assert packed[0].status == "diverged"
    assert packed[0].reason.startswith(f"diverged at step {packed[0].steps_done}: ")
    assert packed[0].steps_done < 4
    assert packed[0].summary["stability/diverged"] == 1.0
    assert packed[1].status == "completed" and packed[1].steps_done == 4
    assert_same_history(packed[1], run(healthy, results_dir=tmp_path))


def test_a_failing_trial_ends_alone_with_its_reason(tmp_path):
    packed = run_pack_with_a_broken_tracker(cfg, tmp_path)
    assert packed[0].status == "failed"
    assert packed[0].reason == "RuntimeError: tracking store unreachable"
    assert len(packed[0].history["objective/reward"]) == 2  # step 1 was recorded, then it raised
    assert (packed[1].status, packed[1].steps_done) == ("completed", 3)


def test_a_stop_request_interrupts_every_trial(tmp_path):
    asked = []

    def stop_before_step_2():
        asked.append(1)
        return len(asked) > 2  # asked before steps 0, 1 and 2 of trial 0

    packed = run_packed(
        [cfg(steps=5), cfg(steps=5, **{"ppo.eps_clip": 0.3})],
        [{"results_dir": tmp_path, "should_stop": stop_before_step_2}, {"results_dir": tmp_path}],
    )
    assert [(r.status, r.reason, r.steps_done) for r in packed] == [
        ("interrupted", "interrupted at step 2", 2),
        ("interrupted", "interrupted at step 2", 2),
    ]
    assert all(len(r.history["objective/reward"]) == 2 for r in packed)


def test_sigterm_interrupts_every_trial_with_the_signal_as_reason(tmp_path):
    def sigterm_at_step_1(step, metrics):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    with signals_interrupt() as stop:
        packed = run_packed(
            [cfg(steps=5), cfg(steps=5, **{"optim.lr": 1e-2})],
            [{"results_dir": tmp_path}, {"results_dir": tmp_path, "on_metrics": sigterm_at_step_1}],
        )
    assert stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before
    assert [(r.status, r.reason) for r in packed] == [("interrupted", "terminated by SIGTERM")] * 2
    assert packed[0].steps_done == 2  # trial 0 had taken step 1 when trial 1's signal came
    assert packed[1].steps_done < 5


def test_what_cannot_share_a_base_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^model_options\.lora: packing needs LoRA adapters"):
        run_packed([build_run_config({"tiny": TINY})], [{}])
    cases = {
        r"^model_options\.lora\.r: run 1 of the pack differs": {"model_options.lora.r": 8},
        r"^tiny\.hidden_size: run 1": {"tiny.hidden_size": 64},
        r"^rollout\.n_samples: run 1": {"rollout.n_samples": 4},
        r"^seed: run 1": {"seed": 1},
        r"^rollout\.async: not packable yet": {"rollout.async.max_staleness": 1},
    }
    big = {"model_options.lora.r": 1024, "rollout.sampler_backend": "vllm"}
    with pytest.raises(ValueError, match=r"^model_options\.lora\.r: a pack's engine serves"):
        run_packed([cfg(**big), cfg(**big)], [{}, {}])
    for pattern, over in cases.items():
        with pytest.raises(ValueError, match=pattern) as err:
            run_packed([cfg(), cfg(**over)], [{}, {}])
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="1 run configs but 2 sets of hooks"):
        run_packed([cfg()], [{}, {}])


def test_pack_key_groups_cells_that_differ_in_ppo_settings_only():
    a = cfg(**{"ppo.eps_clip": 0.1, "optim.lr": 1e-3, "warm_start.lr": 1e-2})
    b = cfg(**{"ppo.eps_clip": 0.3, "optim.lr": 1e-2, "ppo.kl_ctl": 0.1})
    assert pack_key(a) == pack_key(b) and incompatible_field(a, b) is None
    c = cfg(**{"task_options": {"max_len": 6}})
    assert pack_key(c) != pack_key(a)
    assert incompatible_field(a, c) == "task_options.max_len"
    d = cfg(**{"model_options.dtype": "bfloat16"})
    assert incompatible_field(a, d) == "model_options.dtype"


def test_the_docs_list_every_base_field():
    text = (ROOT / "docs" / "scaling.md").read_text()
    section = text[text.index("## Packing") :]
    listed = [f for f in BASE_FIELDS if f"`{f}`" in section]
    assert listed == list(BASE_FIELDS)
