"""The tiny model and tokenizer built in code, loading local HF directories, devices."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from harness.model.build import (
    TinyModelConfig,
    build_model,
    build_tokenizer,
    load_model_and_tokenizer,
    model_fingerprint,
    resolve_device,
)


def test_tokenizer_is_character_level_with_fixed_special_ids():
    tok = build_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.padding_side == "left"
    assert len(tok) == 100  # 4 specials + 95 printable ASCII + newline
    text = "rev 40213=[a, b] (x > y) < -1.5 : + Z"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, nothing added
    assert tok.decode(ids) == text
    assert tok("0")["input_ids"] == [4 + ord("0") - 32]
    assert build_tokenizer().get_vocab() == tok.get_vocab()  # deterministic ids
    assert tok("é")["input_ids"] == [tok.unk_token_id]
    assert tok.decode([1, *tok("12")["input_ids"], 2, 0], skip_special_tokens=True) == "12"


def test_tokenizer_pads_on_the_left():
    tok = build_tokenizer()
    enc = tok(["12=", "12345="], padding=True)
    assert enc["input_ids"][0][:3] == [0, 0, 0]
    assert enc["attention_mask"] == [[0, 0, 0, 1, 1, 1], [1] * 6]


def test_tiny_config_has_help_and_validates():
    for f in dataclasses.fields(TinyModelConfig):
        assert f.metadata.get("help"), f.name
    cfg = TinyModelConfig()
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size) == (
        128,
        2,
        4,
        256,
    )
    assert cfg.max_position_embeddings == 512
    with pytest.raises(ValueError, match="divisible"):
        TinyModelConfig(hidden_size=130, num_heads=4)


def test_build_model_is_seeded_and_leaves_global_rng_alone():
    tok = build_tokenizer()
    state = torch.get_rng_state()
    a, b, c = build_model(tok, seed=0), build_model(tok, seed=0), build_model(tok, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    assert isinstance(a, LlamaForCausalLM) and not a.training
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    cfg = a.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (100, 128, 2)
    assert cfg.eos_token_id == 2 and cfg.pad_token_id == 0 and not cfg.tie_word_embeddings
    assert sum(p.numel() for p in a.parameters()) == 353_920
    small = build_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2), seed=0)
    assert small.config.hidden_size == 32 and len(small.model.layers) == 1


def test_load_tiny_and_missing_directory():
    model, tok = load_model_and_tokenizer("tiny", seed=3)
    assert torch.equal(model.lm_head.weight, build_model(build_tokenizer(), seed=3).lm_head.weight)
    assert tok.eos_token_id == 2
    with pytest.raises(ValueError) as err:
        load_model_and_tokenizer("no/such/dir")
    assert str(err.value) == (
        "model: directory 'no/such/dir' does not exist "
        "(use 'tiny' or a local Hugging Face model directory)"
    )


def test_load_local_hf_directory_roundtrip(tmp_path):
    tok = build_tokenizer()
    model = build_model(tok, TinyModelConfig(hidden_size=32, num_heads=2), seed=5)
    tok.pad_token = None  # a tokenizer without a pad token gets EOS as pad
    tok.padding_side = "right"
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, ltok = load_model_and_tokenizer(str(tmp_path))
    assert ltok.pad_token == ltok.eos_token == "<eos>" and ltok.padding_side == "left"
    assert loaded.config.pad_token_id is not None and not loaded.training
    ids = torch.tensor([tok("rev 123=")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, loaded(input_ids=ids).logits, atol=1e-6)


def test_model_fingerprint_tracks_shape_and_files(tmp_path):
    assert model_fingerprint("tiny") != model_fingerprint("tiny", TinyModelConfig(hidden_size=64))
    (tmp_path / "config.json").write_text("{}")
    before = model_fingerprint(str(tmp_path))
    (tmp_path / "config.json").write_text('{"a": 1}')
    assert model_fingerprint(str(tmp_path)) != before


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(ValueError, match="not a valid device"):
        resolve_device("gpu")
    with pytest.raises(ValueError, match="not a valid device"):
        resolve_device("cuda:x")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device is available"):
            resolve_device("cuda")
        with pytest.raises(ValueError, match="no CUDA device is available"):
            resolve_device("cuda:1")
    else:
        n = torch.cuda.device_count()
        assert resolve_device("cuda:0") == torch.device("cuda", 0)
        with pytest.raises(ValueError, match="CUDA device"):
            resolve_device(f"cuda:{n}")
