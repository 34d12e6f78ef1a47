"""Every architecture docs/models.md lists, on the engine (``rollout.sampler_backend: vllm``), and
the process the engine ran in left as the next run expects it (harness/sampling/vllm_host.py).

vLLM 0.32 serves Phi and GPT-NeoX only through its Transformers backend, which decorates the
``transformers`` model class itself for ``torch.compile``; in-process, the learner's model is an
instance of that class. These tests build random-init 2-layer models of the real architectures
(tests/support/hf_archs.py, no downloads). The engine starts are slow-marked (seconds idle, a
minute on the loaded 2-core machine); the checks without an engine start run in the fast suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from harness.config import build_run_config
from harness.model.engine_support import engine_installed
from harness.model.logprobs import forward_logprobs
from harness.sampling.vllm import EngineSampler
from harness.sampling.vllm_host import engine_weights, model_classes_kept, stderr_filtered
from tests.support.hf_archs import (
    ARCHS,
    arch_configs,
    build_bpe_tokenizer,
    engine_arch_config,
    save_engine_arch,
)
from tests.support.sampling import draw

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
needs_engine = pytest.mark.skipif(
    not engine_installed(), reason="vllm not installed (python tools/install_engine.py)"
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _random_init(config, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config).eval()


def _logprob_gap(model, rb) -> torch.Tensor:
    """|ℓb − ℓp| on every generated token: the engine's against the learner's float32 forward."""
    with torch.no_grad():
        lp = forward_logprobs(model, rb.input_ids, rb.attention_mask)[0]
    return (rb.logprobs - lp)[rb.loss_mask.bool()].abs()


# ---- no engine start


@pytest.mark.parametrize(
    ("name", "tied"),
    [("gemma2", True), ("gpt2", True), ("opt", True), ("qwen2", False), ("phi", False)],
)
def test_a_tied_output_embedding_is_not_sent_to_the_engine(name, tied):
    """Gemma2's engine loader rejects a tied ``lm_head.weight`` ("no module or parameter named
    'lm_head'"), so no tied one is sent: the engine ties it from the config. An untied one is a
    weight of its own and is sent."""
    model = _random_init(arch_configs(len(build_bpe_tokenizer()))[name])
    assert model.config.tie_word_embeddings is tied
    sent = engine_weights(model)
    assert ("lm_head.weight" in sent) is not tied
    assert set(sent) | ({"lm_head.weight"} if tied else set()) == set(model.state_dict())


def test_the_engines_numa_line_is_dropped_from_stderr_and_the_rest_passes(capfd):
    """The CPU worker's C++ warning goes to file descriptor 2, past Python; the filter drops that
    line (written in two pieces, as C++ streams do) and passes everything else, in order."""
    numa = (
        "[W1205 02:43:29.573944204 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for "
        "memory allocation on the NUMA nodes (0). (function init_cpu_memory_env)"
    )
    with stderr_filtered():
        os.write(2, b"first line\n")
        os.write(2, numa.encode())
        os.write(2, b"\n")
        os.write(2, b"[W other C++ warning]\n")
        os.write(2, b"no newline at the end")
    err = capfd.readouterr().err
    assert err == "first line\n[W other C++ warning]\nno newline at the end", err


@needs_engine
def test_a_model_class_the_engine_decorates_is_put_back():
    """vLLM's Transformers backend decorates the decoder class in place
    (``support_torch_compile``, as vllm/model_executor/models/transformers/base.py does for
    Phi); afterwards the learner's model fails its forward and the class cannot be built outside
    an engine. Inside ``model_classes_kept`` the same decoration is undone at the block's end."""
    from transformers.models.phi.modeling_phi import PhiModel
    from vllm.compilation.decorators import support_torch_compile

    config = arch_configs(len(build_bpe_tokenizer()))["phi"]
    model = _random_init(config)
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        before = model(ids).logits
    bases, attrs = PhiModel.__bases__, dict(PhiModel.__dict__)
    with model_classes_kept():
        support_torch_compile(dynamic_arg_dims={"input_ids": 1})(PhiModel)
        with pytest.raises(AttributeError, match="do_not_compile"):  # what a run died of
            model(ids)
    assert PhiModel.__bases__ == bases and dict(PhiModel.__dict__) == attrs
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
        _random_init(config)  # the class builds again outside an engine


# ---- every architecture on the engine


@pytest.mark.slow
@needs_engine
@pytest.mark.parametrize("name", ARCHS)
def test_the_engine_serves_the_architecture_and_the_learner_still_runs(name):
    """The engine's log-probs equal the learner's to float32 precision (Llama, the built-in
    model, is tests/run/test_engine.py's); after the engine started in this process the learner's
    model still runs its forward, with the same numbers, and its class still builds."""
    tok = build_bpe_tokenizer()
    config = engine_arch_config(name, len(tok))
    model = _random_init(config)
    rb = None
    sampler = EngineSampler(CPU, sample_kw={"eos_token_ids": [2], "max_positions": 64})
    try:
        rb = draw(
            sampler,
            model,
            tok,
            ["rev 1234=", "rev 98="],
            n_samples=2,
            max_new_tokens=8,
            generator=torch.Generator().manual_seed(0),
            temperature=1.0,
            top_p=1.0,
        )
        gap = _logprob_gap(model, rb)
        assert gap.numel() >= 4 and float(gap.max()) < 1e-5, float(gap.max())
    finally:
        sampler.close()
    with torch.no_grad():
        again = forward_logprobs(_random_init(config), rb.input_ids, rb.attention_mask)[0]
        assert torch.equal(again, forward_logprobs(model, rb.input_ids, rb.attention_mask)[0])


SHORT = {
    "steps": 2,
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 6},
    "eval": {"every": 0, "n_prompts": 2},
    "threads": 1,
}
KEYS = ("objective/reward", "policy/loss", "policy/entropy", "rollout/response_length")
FRESH = """
import json, sys
from harness.config import build_run_config
from harness.run.trainers import train
res = train(build_run_config(json.loads(sys.argv[1])), results_dir=sys.argv[2])
assert res.status == "completed", res.reason
print(json.dumps({k: res.history[k] for k in json.loads(sys.argv[3])}))
"""


@pytest.mark.slow
@needs_engine
def test_a_run_after_an_engine_run_in_the_same_process_gets_a_fresh_processs_numbers(tmp_path):
    """A sweep worker runs cells one after another in its process. On Phi (served through the
    engine's Transformers backend) the engine run completes, and the local run after it logs
    what the same run logs in a fresh process: the engine left nothing behind that changes it
    (it used to fail, 'Current vLLM config is not set')."""
    from harness.run.trainers import train

    local = {**SHORT, "model": str(save_engine_arch("phi", tmp_path, build_bpe_tokenizer()))}
    engine = {**local, "rollout": {**SHORT["rollout"], "sampler_backend": "vllm"}}
    out = subprocess.run(
        [sys.executable, "-c", FRESH, json.dumps(local), str(tmp_path / "fresh"), json.dumps(KEYS)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    fresh = json.loads(out.stdout.strip().splitlines()[-1])

    res = train(build_run_config(engine), results_dir=tmp_path / "engine")
    assert res.status == "completed", res.reason
    assert max(res.history["mismatch/kl_k3"]) < 1e-9  # float32 engine vs float32 learner
    after = train(build_run_config(local), results_dir=tmp_path / "after")
    assert after.status == "completed", after.reason
    for k in KEYS:
        assert after.history[k] == pytest.approx(fresh[k], rel=1e-6, abs=1e-9), k
