"""A model directory whose config.json contradicts its weights or states an impossible position
limit, and an engine KV cache that neither the machine nor one full-length sequence fits: one
line on stderr, exit 2, nothing written, before anything starts (harness/model/checkpoint.py,
harness/model/engine_memory.py, harness.config.preflight.check_engine_kv_cache).

Each case failed late before these checks, or not at all: ``architectures: [MambaForCausalLM]``
over Llama weights trained a Llama locally and failed 45 s into the engine's start;
``model_type: mamba`` as well trained a randomly initialised Mamba without an error; a
``max_position_embeddings`` of -5 failed at the engine's start with an unrelated line, and one of
10**12 made it allocate 4 TB for its rotary table.  Models are random-init Llamas built here at
the CPU engine's head size (tests/support/hf_archs.py); no engine is started.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, MixtralConfig
from typer.testing import CliRunner

from harness.cli import app
from harness.config import ConfigError, load_run_config
from harness.model.checkpoint import (
    MAX_POSITIONS,
    checkpoint_names,
    declared_architecture_problem,
    position_problem,
    weights_problem,
)
from harness.model.engine_memory import kv_bytes_per_token
from harness.model.engine_support import engine_installed
from tests.support.hf_archs import ARCHS, build_bpe_tokenizer, engine_arch_config
from tests.support.memory_limit import SMALL, assert_one_line

GIB = 1 << 30
needs_engine = pytest.mark.skipif(
    not engine_installed(), reason="vllm not installed (python tools/install_engine.py)"
)
BACKENDS = ["auto", pytest.param("vllm", marks=needs_engine)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama at the CPU engine's head size (32), 1 KV head, 64 positions."""
    tok = build_bpe_tokenizer()
    config = LlamaConfig(
        hidden_size=64,
        head_dim=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=64,
        vocab_size=len(tok),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    path = tmp_path_factory.mktemp("llama") / "llama"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def edited(root: Path, name: str, base: Path, **config: Any) -> Path:
    """A copy of the model directory ``base`` with ``config`` merged into its config.json."""
    path = root / name
    shutil.copytree(base, path)
    data = json.loads((path / "config.json").read_text())
    data.update(config)
    (path / "config.json").write_text(json.dumps(data))
    return path


def cli_refuses(tmp_path: Path, sets: list[str], expect: str) -> None:
    results = tmp_path / "results"
    argv = [x for s in sets for x in ("--set", s)]
    r = CliRunner().invoke(app, ["run", *argv, *SMALL, "--results-dir", str(results)])
    assert_one_line(r.exit_code, r.stderr if r.stderr is not None else r.output, expect, results)


# --- config.json against the weights and against itself: both samplers ------------------------


def _declared_mamba(tmp: Path, llama: Path) -> tuple[Path, str]:
    path = edited(tmp, "declared", llama, architectures=["MambaForCausalLM"])
    return path, (
        f"model: '{path}': config.json names architecture MambaForCausalLM, a mamba model, but "
        "its model_type is llama (transformers builds the model from model_type, the inference "
        "engine from architectures)"
    )


def _mamba_type(tmp: Path, llama: Path) -> tuple[Path, str]:
    path = edited(tmp, "mamba", llama, architectures=["MambaForCausalLM"], model_type="mamba")
    return path, (
        f"model: {path}/model.safetensors does not hold the weights of MambaForCausalLM "
        "(config.json model_type mamba): 12 of the 12 tensors checked (the first layer's and "
        "those outside the layers) are missing, e.g. backbone.embeddings.weight; the checkpoint "
        "has e.g. model.layers.0.input_layernorm.weight"
    )


def _negative_positions(tmp: Path, llama: Path) -> tuple[Path, str]:
    path = edited(tmp, "negative", llama, max_position_embeddings=-5)
    return path, (
        f"model: '{path}': config.json max_position_embeddings -5 must be a positive integer"
    )


def _absurd_positions(tmp: Path, llama: Path) -> tuple[Path, str]:
    path = edited(tmp, "absurd", llama, max_position_embeddings=10**12)
    return path, (
        f"model: '{path}': config.json max_position_embeddings 1,000,000,000,000 is more than "
        "16,777,216 positions"
    )


def _header_past_the_file(tmp: Path, llama: Path) -> tuple[Path, str]:
    path = edited(tmp, "header", llama)
    weights = path / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as fh:  # a header length of 10**15 bytes: read before any tensor
        fh.write((10**15).to_bytes(8, "little"))
    return path, (
        f"model: {weights}: not a safetensors file (a header of 1,000,000,000,000,000 bytes in "
        f"a file of {size:,})"
    )


MODEL_CASES = {
    "architecture-of-another-model-type": _declared_mamba,
    "model-type-of-other-weights": _mamba_type,
    "negative-positions": _negative_positions,
    "absurd-positions": _absurd_positions,
    "safetensors-header-past-the-file": _header_past_the_file,
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_a_model_directory_that_contradicts_itself_is_one_line(case, backend, tmp_path, llama):
    path, expect = MODEL_CASES[case](tmp_path, llama)
    sets = [f"model={path}", f"rollout.sampler_backend={backend}"]
    cli_refuses(tmp_path, sets, expect)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_same_directory_unedited_is_accepted(backend, llama):
    """The control: what the cases above edit is what they refuse."""
    cfg = load_run_config(None, [f"model={llama}", f"rollout.sampler_backend={backend}"])
    assert cfg.model == str(llama)


def test_gpt2_position_table_of_zero_rows_is_named_by_its_own_key():
    config = engine_arch_config("gpt2", 320)
    config.n_positions = 0
    assert position_problem(config) == (
        "config.json n_positions 0 must be a positive integer (the longest sequence the model "
        "takes)"
    )
    config.n_positions = MAX_POSITIONS
    assert position_problem(config) is None  # the bound itself is a limit a model may state


def test_every_tested_architecture_passes_the_checks(hf_dirs):
    """No false refusal on the seven architectures docs/models.md lists, as save_pretrained
    writes them."""
    for name in ARCHS:
        config = AutoConfig.from_pretrained(hf_dirs[name])
        assert position_problem(config) is None, name
        assert declared_architecture_problem(config) is None, name
        assert weights_problem(str(hf_dirs[name]), config) is None, name


def test_a_checkpoint_transformers_renames_on_load_passes(tmp_path):
    """Mixtral's checkpoint keeps one tensor per expert (w1, w2, w3), which transformers fuses
    into experts.gate_up_proj / down_proj when it loads: 3 of the model's 11 names are not in the
    checkpoint, a minority, so the name comparison lets it through."""
    config = MixtralConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
        vocab_size=100,
        max_position_embeddings=64,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    found = checkpoint_names(tmp_path)
    assert found is not None
    assert "model.layers.0.block_sparse_moe.experts.0.w1.weight" in found[0]
    assert weights_problem(str(tmp_path), AutoConfig.from_pretrained(tmp_path)) is None


# --- the engine's KV cache ---------------------------------------------------------------------


@needs_engine
def test_a_kv_cache_larger_than_the_machine_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESS_MEMORY_CHECK", raising=False)
    monkeypatch.setattr(
        "harness.config.preflight.available_memory", lambda: (8 * GIB, "RAM available")
    )
    cli_refuses(
        tmp_path,
        ["rollout.sampler_backend=vllm", "rollout.engine_kv_cache_gib=9"],
        "rollout.engine_kv_cache_gib: 9 GiB is more than this machine's memory (8.0 GiB RAM "
        "available); lower it, or set HARNESS_MEMORY_CHECK=off",
    )
    load_run_config(None, ["rollout.sampler_backend=vllm", "rollout.engine_kv_cache_gib=8"])


@needs_engine
def test_the_declared_maximum_is_refused_by_this_machine(tmp_path, monkeypatch):
    """4,096 GiB, the field's static bound, measured against this machine's real memory."""
    from harness.config.resources import available_memory

    ram, _ = available_memory()
    if ram is None or ram >= 4096 * GIB:
        pytest.skip("this machine's memory is unknown or holds 4 TiB")
    monkeypatch.delenv("HARNESS_MEMORY_CHECK", raising=False)
    sets = ["rollout.sampler_backend=vllm", "rollout.engine_kv_cache_gib=4096"]
    cli_refuses(tmp_path, sets, "rollout.engine_kv_cache_gib: 4,096 GiB is more than this machine")
    monkeypatch.setenv("HARNESS_MEMORY_CHECK", "off")  # a cluster whose workers have more
    assert load_run_config(None, sets).rollout.engine_kv_cache_gib == 4096
    auto = ["rollout.sampler_backend=auto", "rollout.engine_kv_cache_gib=4096"]
    monkeypatch.delenv("HARNESS_MEMORY_CHECK")
    assert load_run_config(None, auto).rollout.engine_kv_cache_gib == 4096  # unused there


@needs_engine
def test_a_grid_value_the_machine_cannot_hold_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESS_MEMORY_CHECK", raising=False)
    monkeypatch.setattr(
        "harness.config.preflight.available_memory", lambda: (8 * GIB, "RAM available")
    )
    doc = {
        "name": "kv",
        "base": {"rollout": {"sampler_backend": "vllm", "max_new_tokens": 4}, "eval": {"every": 0}},
        "grid": {"rollout.engine_kv_cache_gib": [1, 4096]},
        "seeds": 1,
        "steps": 1,
    }
    f = tmp_path / "kv.yaml"
    f.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["ablate", str(f), "--results-dir", str(results)])
    assert_one_line(
        r.exit_code,
        r.stderr if r.stderr is not None else r.output,
        "grid.rollout.engine_kv_cache_gib: value 4096 rejected: 4,096 GiB is more than this "
        "machine's memory (8.0 GiB RAM available)",
        results,
    )


@needs_engine
def test_a_kv_cache_without_room_for_one_full_length_sequence_is_one_line(tmp_path, llama):
    """4,000,000 positions x 512 bytes a token (2 layers x K and V x 1 head x 32 x float32) is
    1.91 GiB, more than the 1 GiB default: vLLM refuses to start (measured: 2,200,000 positions
    of this shape asked it for 1.05 GiB, 2,000,000 started)."""
    path = edited(tmp_path, "long", llama, max_position_embeddings=4_000_000)
    cli_refuses(
        tmp_path,
        [f"model={path}", "rollout.sampler_backend=vllm"],
        "rollout.engine_kv_cache_gib: the engine starts only if the KV cache of one sequence of "
        "the model's 4,000,000 positions (config.json) fits: 1.91 GiB (512 bytes a token in "
        "float32), more than the 1 GiB reserved; set it to 2 or lower the model's position limit",
    )
    for fix in (["rollout.engine_kv_cache_gib=2"], ["rollout.sampler_dtype=bfloat16"]):
        load_run_config(None, [f"model={path}", "rollout.sampler_backend=vllm", *fix])
    load_run_config(None, [f"model={path}"])  # the local sampler allocates nothing by it


@needs_engine
def test_the_built_in_model_at_its_longest_is_checked_too(tmp_path):
    """The tiny model's default shape (2 layers x 4 heads of 32) at 1,048,576 positions holds
    2,048 bytes a token in float32: exactly 2 GiB, and vLLM also keeps a block back."""
    cli_refuses(
        tmp_path,
        ["rollout.sampler_backend=vllm", "tiny.max_position_embeddings=1048576"],
        "the model's 1,048,576 positions (tiny.max_position_embeddings) fits: 2.00 GiB (2,048 "
        "bytes a token in float32), more than the 1 GiB reserved; set it to 3",
    )


def test_kv_bytes_per_token_of_each_tested_architecture():
    """2 (K and V) x full-attention layers x KV heads x head size x bytes, at the engine's shape
    (2 layers, head size 32): Gemma2 alternates sliding and full layers (one full), Mistral with
    a sliding window keeps only its window, an architecture outside the list is not estimated."""
    want = {"gpt2": 1024, "opt": 1024, "qwen2": 512, "mistral": 512, "gpt_neox": 1024, "phi": 1024}
    want["gemma2"] = 256
    got = {name: kv_bytes_per_token(engine_arch_config(name, 320), "float32") for name in ARCHS}
    assert got == want
    assert kv_bytes_per_token(engine_arch_config("qwen2", 320), "bfloat16") == 256
    windowed = engine_arch_config("mistral", 320)
    windowed.sliding_window = 16
    assert kv_bytes_per_token(windowed, "float32") == 0
    mamba = AutoConfig.for_model("mamba", hidden_size=64, num_hidden_layers=2)
    assert kv_bytes_per_token(mamba, "float32") is None


def test_a_refusal_is_a_config_error_for_the_library_too(llama, tmp_path):
    path = edited(tmp_path, "neg", llama, max_position_embeddings=0)
    with pytest.raises(ConfigError, match="max_position_embeddings 0 must be a positive integer"):
        load_run_config(None, [f"model={path}"])
