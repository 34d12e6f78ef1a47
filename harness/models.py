"""The policy model and its tokenizer: a tiny Llama built in code, or any local HF causal LM.

Why a tiny model built in code: the harness must run (and its tests must pass) on a laptop CPU
with no network, so nothing may download weights. A 2-layer, 128-wide Llama with a
character-level vocabulary trains on the digit tasks in minutes.

Why Llama (RoPE) rather than GPT-2: PPO compares log-probs recorded while sampling (KV cache,
left-padded prompts) with log-probs recomputed by a full forward pass. With learned absolute
positions the two disagree under left padding unless position ids are threaded everywhere; with
RoPE and explicit ``position_ids`` (see :func:`harness.rollout.position_ids`) they agree to float
precision.

Why untied embeddings: the tiny vocabulary makes tying save almost nothing, and untied weights
keep every parameter a distinct tensor, so plain ``state_dict`` copies (staleness ring, warm-start
cache) never have to reason about shared storage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Printable ASCII (space .. '~') plus newline: digits, letters and every symbol a task prompt or a
# JSONL answer is likely to use. Fixed order => fixed ids on every machine.
CHARS = tuple(chr(c) for c in range(32, 127)) + ("\n",)
# Attention kernel for the tiny model's HF forward (the training pass). "eager" and "sdpa" are
# both deterministic on CPU and measured equally fast at this size (fwd+bwd of 128x42 tokens:
# ~190 ms either way); sampling bypasses it through harness.rollout's functional decoder.
TINY_ATTN_IMPLEMENTATION = "sdpa"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer built in code: one token per character, deterministic ids.

    Ids 0..3 are ``<pad> <bos> <eos> <unk>``; then printable ASCII in code-point order, then
    ``\\n``. Nothing is added around the text (no BOS): ``encode(s)`` has exactly ``len(s)`` ids, so
    prompt and completion lengths in tokens equal their lengths in characters. Characters outside
    the vocabulary map to ``<unk>``. Padding is on the left, as batched sampling needs.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    # BPE with no merges and no pre-tokenizer splits text into single characters; Fuse() joins
    # them back without the spaces the default decoder would insert.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    return fast


@dataclass
class TinyModelConfig:
    """Shape of the tiny Llama policy (defaults: ~0.4M parameters, fast on one CPU core)."""

    # Bounds (ge/le) are checked by harness.configtools when a config is built from YAML.
    hidden_size: int = field(
        default=128, metadata={"help": "Width of the residual stream.", "ge": 1, "le": 65_536}
    )
    num_layers: int = field(
        default=2, metadata={"help": "Number of transformer blocks.", "ge": 1, "le": 1024}
    )
    num_heads: int = field(
        default=4,
        metadata={
            "help": "Attention heads per block (must divide hidden_size).",
            "ge": 1,
            "le": 1024,
        },
    )
    intermediate_size: int = field(
        default=256,
        metadata={"help": "Hidden width of each block's SwiGLU MLP.", "ge": 1, "le": 262_144},
    )
    max_position_embeddings: int = field(
        default=512,
        metadata={
            "help": "Longest prompt + completion the RoPE tables cover.",
            "ge": 1,
            "le": 1_048_576,
        },
    )

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"tiny.{name} must be positive; got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"tiny.hidden_size ({self.hidden_size}) must be divisible by tiny.num_heads "
                f"({self.num_heads})"
            )


def build_model(
    tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig | None = None, seed: int = 0
) -> LlamaForCausalLM:
    """A randomly initialised tiny Llama sized to ``tokenizer``; the same seed gives the same weights.

    Initialisation runs inside ``torch.random.fork_rng`` so the caller's global RNG state is left
    exactly as it was (building a model must not shift the sampling stream of a run).
    """
    cfg = cfg or TinyModelConfig()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )
    config._attn_implementation = TINY_ATTN_IMPLEMENTATION
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model = model.to(torch.float32)  # type: ignore[arg-type]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.eval()  # no dropout anywhere: sampling and training must see the same function
    return model


def resolve_device(spec: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` -> a device; asking for a missing GPU is an error."""
    s = spec.strip().lower()
    if s == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if s == "cpu":
        return torch.device("cpu")
    if s == "cuda" or (s.startswith("cuda:") and s[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device: '{spec}' requested but no CUDA device is available (use 'cpu' or 'auto')"
            )
        if s == "cuda":
            return torch.device("cuda")
        count = torch.cuda.device_count()
        if int(s[5:]) >= count:
            raise ValueError(f"device: '{spec}' requested but only {count} CUDA device(s) exist")
        return torch.device("cuda", int(s[5:]))
    raise ValueError(f"device: '{spec}' is not a valid device (use auto, cpu, cuda or cuda:N)")


def _missing_dir_error(spec: str) -> ValueError:
    return ValueError(
        f"model: directory '{spec}' does not exist "
        "(use 'tiny' or a local Hugging Face model directory)"
    )


def load_tokenizer(spec: str = "tiny") -> PreTrainedTokenizerBase:
    """The tokenizer for ``spec``: the built-in character tokenizer, or the directory's own one.

    A loaded tokenizer without a pad token pads with EOS; padding is always on the left.
    """
    if spec == "tiny":
        return build_tokenizer()
    if not Path(spec).is_dir():
        raise _missing_dir_error(spec)
    tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"model: tokenizer in '{spec}' has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(
    spec: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    tiny: TinyModelConfig | None = None,
) -> PreTrainedModel:
    """The model for ``spec`` on ``device``, in eval mode (dropout off), float32 weights.

    ``tiny`` only shapes the ``"tiny"`` model; ``seed`` only seeds its random initialisation.
    """
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    if spec == "tiny":
        model: PreTrainedModel = build_model(tokenizer, tiny, seed=seed)
    else:
        if not Path(spec).is_dir():
            raise _missing_dir_error(spec)
        model = AutoModelForCausalLM.from_pretrained(
            spec, local_files_only=True, dtype=torch.float32
        )
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        if model.generation_config is not None and model.generation_config.pad_token_id is None:
            model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.eval()
    return model.to(dev)  # type: ignore[arg-type,no-any-return]


def load_model_and_tokenizer(
    spec: str = "tiny",
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    tiny: TinyModelConfig | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``"tiny"`` (built in code) or a local Hugging Face causal-LM directory -> (model, tokenizer).

    Only local files are read (``local_files_only=True``): the harness never downloads weights.
    """
    if spec != "tiny" and not Path(spec).is_dir():
        raise _missing_dir_error(spec)
    tokenizer = load_tokenizer(spec)
    model = load_model(spec, tokenizer, seed=seed, device=device, tiny=tiny)
    return model, tokenizer


def model_fingerprint(spec: str, tiny: TinyModelConfig | None = None) -> dict[str, object]:
    """What a model spec depends on, for cache keys: the tiny shape, or the directory's files.

    For a directory this is the absolute path plus each file's size and mtime (cheap, and it
    changes whenever the weights are rewritten), not a hash of gigabytes of weights.
    """
    if spec == "tiny":
        shape = tiny or TinyModelConfig()
        return {
            "spec": "tiny",
            "tiny": {k: getattr(shape, k) for k in shape.__dataclass_fields__},
            "attn": TINY_ATTN_IMPLEMENTATION,
        }
    root = Path(spec).resolve()
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            st = os.stat(path)
            files[str(path.relative_to(root))] = [st.st_size, st.st_mtime_ns]
    return {"spec": str(root), "files": files}


__all__ = [
    "CHARS",
    "SPECIAL_TOKENS",
    "TinyModelConfig",
    "build_model",
    "build_tokenizer",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "model_fingerprint",
    "resolve_device",
]
