"""Random-init 2-layer models of real architectures + a byte-level BPE tokenizer, built in code.

Nothing is downloaded: the tokenizer is trained with ``tokenizers`` on task-like text, each model
is a tiny config of its architecture, and both are written with ``save_pretrained`` into a
directory that the harness then loads as ``model=<dir>`` exactly as a user's model.
Architectures whose released checkpoints ship dropout get dropout 0.1 here, so the tests see
what loading such a checkpoint gives.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    GPT2Config,
    GPTNeoXConfig,
    MistralConfig,
    OPTConfig,
    PhiConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

POSITIONS = 64  # every model's position limit (GPT-2 n_positions, RoPE max_position_embeddings)
HIDDEN, HEADS, LAYERS, FF = 32, 2, 2, 64


def build_bpe_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style) trained on digit-task text; ids 0..2 are pad, bos, eos."""
    rng = random.Random(0)
    corpus = []
    for _ in range(2000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 8)))
        corpus.append(f"rev {digits}={digits[::-1]}\nadd {digits}+{digits[:3]}=")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        padding_side="left",
    )


def arch_configs(vocab: int) -> dict[str, Any]:
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "vocab_size": vocab}
    rope = {
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": FF,
        "max_position_embeddings": POSITIONS,
        **ids,
    }
    return {
        "gpt2": GPT2Config(
            n_positions=POSITIONS,
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=HEADS,
            resid_pdrop=0.1,
            embd_pdrop=0.1,
            attn_pdrop=0.1,
            **ids,
        ),
        "opt": OPTConfig(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            ffn_dim=FF,
            num_attention_heads=HEADS,
            max_position_embeddings=POSITIONS,
            word_embed_proj_dim=HIDDEN,
            dropout=0.1,
            attention_dropout=0.1,
            activation_dropout=0.1,
            **ids,
        ),
        "qwen2": Qwen2Config(num_key_value_heads=1, attention_dropout=0.1, **rope),
        "mistral": MistralConfig(num_key_value_heads=1, sliding_window=None, **rope),
        "gpt_neox": GPTNeoXConfig(
            rotary_pct=0.5, hidden_dropout=0.1, attention_dropout=0.1, **rope
        ),
        "gemma2": Gemma2Config(head_dim=16, num_key_value_heads=1, **rope),
        "phi": PhiConfig(
            resid_pdrop=0.1,
            embd_pdrop=0.1,
            attention_dropout=0.1,
            partial_rotary_factor=0.5,
            **rope,
        ),
    }


ARCHS = ("gpt2", "opt", "qwen2", "mistral", "gpt_neox", "gemma2", "phi")


def save_arch(name: str, root: Path, tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Path:
    """Random-init ``name`` with ``seed`` saved (model + tokenizer) under ``root/name``."""
    return _save(arch_configs(len(tokenizer))[name], root / name, tokenizer, seed)


def _save(config: Any, path: Path, tokenizer: PreTrainedTokenizerFast, seed: int) -> Path:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_chat_qwen2(target: Path, max_position_embeddings: int) -> None:
    """A tiny Qwen2 with a chat template saved (model + tokenizer) at ``target``: what the docs'
    YAML for Qwen2.5-0.5B-Instruct loads, without the download."""
    tok = build_bpe_tokenizer()
    tok.chat_template = "{{ bos_token }}[user] {{ messages[0]['content'] }}\n[assistant] "
    config = arch_configs(len(tok))["qwen2"]
    config.max_position_embeddings = max_position_embeddings
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(target)
    tok.save_pretrained(target)


# Every architecture above at width 64 over 2 heads: head size 32, one the CPU engine's attention
# kernels take (the shapes above have 16, which only the harness's own samplers run).
ENGINE_WIDTH = {"hidden_size": 64, "head_dim": 32}


def save_engine_arch(
    name: str, root: Path, tokenizer: PreTrainedTokenizerFast, seed: int = 0
) -> Path:
    """:func:`save_arch` at a shape the CPU engine serves (``ENGINE_WIDTH``), under ``root/name``."""
    return _save(engine_arch_config(name, len(tokenizer)), root / name, tokenizer, seed)


def engine_arch_config(name: str, vocab: int) -> Any:
    """The config of ``name`` (:func:`arch_configs`) at the CPU engine's shape."""
    config = arch_configs(vocab)[name]
    width = ENGINE_WIDTH["hidden_size"]
    if name == "gpt2":
        config.n_embd = width
    elif name == "opt":
        config.hidden_size = config.word_embed_proj_dim = width
    else:
        config.hidden_size = width
    if getattr(config, "head_dim", None) is not None:  # set at init from the narrower width
        config.head_dim = ENGINE_WIDTH["head_dim"]
    return config
