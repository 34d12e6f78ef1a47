"""Packing on CUDA at the shape it is for: four LoRA cells on one random-init Qwen2 of
Qwen2.5-0.5B's shape (24 layers, width 896, ~494M parameters), with the local sampler and with
the engine serving the four adapters.

Run where a GPU is lent (``make test-gpu``); skipped without CUDA (and, for the engine arm,
without vLLM). What they check: every trial completes with finite losses, the pack's peak GPU
memory is well under four unpacked runs' (one base, four adapters and optimizers), and the
engine arm starts one engine for the four trials.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.config import build_run_config
from harness.model.engine_support import engine_installed
from harness.run.loop import run
from harness.run.packing import run_packed
from tests.model.test_real_shape import QWEN2_05B, save_shape

pytest.importorskip("peft")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

K = 4


def cells(path: Path, backend: str) -> list[Any]:
    base = {
        "steps": 3,
        "model": str(path),
        "device": "cuda",
        "task": "reverse",
        "model_options": {"lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}},
        "rollout": {
            "prompts_per_step": 4,
            "n_samples": 4,
            "max_new_tokens": 8,
            "sampler_backend": backend,
        },
        "ppo": {"ppo_n_minibatches": 2},
        "eval": {"every": 0, "n_prompts": 4},
        "threads": 1,
    }
    clips = (0.1, 0.2, 0.3, 0.4)
    return [build_run_config(base, {"ppo.eps_clip": c}) for c in clips[:K]]


def peak_gib(fn: Any) -> tuple[Any, float]:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    return out, torch.cuda.max_memory_allocated() / 2**30


def check_pack(packed: list[Any]) -> None:
    assert [r.status for r in packed] == ["completed"] * K, [r.reason for r in packed]
    for r in packed:
        for key in ("policy/loss", "stability/grad_norm", "objective/reward"):
            assert all(math.isfinite(v) for v in r.history[key]), (key, r.history[key])


def test_four_lora_cells_share_one_05b_base_on_cuda(tmp_path):
    path, n = save_shape(tmp_path, QWEN2_05B, "cuda")
    assert 4.5e8 < n < 5.5e8
    cfgs = cells(path, "local")
    hooks = [{"results_dir": tmp_path / "packed"}] * K
    packed, pack_gib = peak_gib(lambda: run_packed(cfgs, hooks))
    check_pack(packed)
    alone, one_gib = peak_gib(lambda: run(cfgs[0], results_dir=tmp_path / "alone"))
    assert alone.status == "completed", alone.reason
    # Four unpacked runs hold four bases; the pack holds one base and four adapters.
    assert pack_gib < 2.0 * one_gib, (pack_gib, one_gib)
    print(f"peak CUDA memory: pack of {K} {pack_gib:.2f} GiB, one run {one_gib:.2f} GiB")


@pytest.mark.skipif(not engine_installed(), reason="vllm not installed")
def test_the_engine_serves_four_cells_adapters_from_one_start(tmp_path, monkeypatch):
    from harness.sampling.vllm import EngineHost

    starts: list[int] = []
    real = EngineHost.start

    def counting(host: EngineHost, model: Any) -> None:
        starts.append(1)
        real(host, model)

    monkeypatch.setattr(EngineHost, "start", counting)
    path, _ = save_shape(tmp_path, QWEN2_05B, "cuda")
    packed = run_packed(cells(path, "vllm"), [{"results_dir": tmp_path}] * K)
    check_pack(packed)
    assert len(starts) == 1, starts
