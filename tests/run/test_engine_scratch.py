"""The engine's model copy after ``kill -9``: the engine sampler writes the policy as a float32
checkpoint under ``$TMPDIR`` before the engine starts; a run killed there runs no cleanup, so the
copy stays, and the next run's engine start removes it (harness/core/scratch.py).

vLLM itself is replaced by a stand-in (``LLM`` hangs in the killed run, fails in the next one):
what is under test is the run-local directory, not the engine."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

KILLED_RUN = """
import sys, time, types
sys.path.insert(0, {root!r})
import torch
import harness.sampling.vllm as engine
import harness.sampling.vllm_host as host
from harness.model.build import TinyModelConfig, build_model, build_tokenizer

class LLM:  # the engine starting: it has the checkpoint directory; it never returns
    def __init__(self, **kwargs):
        with open({marker!r}, "w") as fh:
            fh.write(kwargs["model"])
        time.sleep(600)

sys.modules["vllm"] = types.SimpleNamespace(LLM=LLM)
host.served_architecture = lambda config, name=None: "LlamaForCausalLM"
tok = build_tokenizer()
model = build_model(tok, TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=16))
engine.EngineSampler(torch.device("cpu")).load(model, 0)
"""


@pytest.mark.slow  # a process that imports torch and transformers, then a second engine start
def test_the_model_copy_a_killed_engine_run_left_is_removed_by_the_next_start(
    tmp_path, monkeypatch
):
    import harness.sampling.vllm as engine
    import harness.sampling.vllm_host as host
    from harness.model.build import TinyModelConfig, build_model, build_tokenizer

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    marker = tmp_path / "engine-starting"
    code = KILLED_RUN.format(root=str(ROOT), marker=str(marker))
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        end = time.monotonic() + 600  # importing torch and transformers on a loaded machine
        while not (marker.exists() and marker.read_text()):
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                raise AssertionError(f"the run ended before its engine started:\n{out[-3000:]}")
            assert time.monotonic() < end, "waited 600 s for the engine to start"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    left = Path(marker.read_text())
    assert left.parent == tmp
    assert (left / "model.safetensors").stat().st_size > 0  # the copy SIGKILL leaves behind

    def fails(**kwargs):
        raise RuntimeError("no engine here")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=fails))
    monkeypatch.setattr(host, "served_architecture", lambda config, name=None: "LlamaForCausalLM")
    tok = build_tokenizer()
    cfg = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=16)
    sampler = engine.EngineSampler(torch.device("cpu"))
    with pytest.raises(engine.EngineError, match="no engine here"):
        sampler.load(build_model(tok, cfg), 0)
    assert not left.exists()
    assert list(tmp.iterdir()) == []  # the failed start removed its own directory too
