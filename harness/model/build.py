"""The policy model and its tokenizer: a tiny Llama built in code, or any local HF causal LM.

Why a tiny model built in code: the harness must run (and its tests must pass) on a laptop CPU
with no network, so nothing may download weights. A 2-layer, 128-wide Llama with a
character-level vocabulary trains on the digit tasks in minutes.

Why Llama (RoPE) rather than GPT-2: PPO compares log-probs recorded while sampling (KV cache,
left-padded prompts) with log-probs recomputed by a full forward pass. With learned absolute
positions the two disagree under left padding unless position ids are threaded everywhere; with
RoPE and explicit ``position_ids`` (see :func:`harness.model.logprobs.position_ids`) they agree to float
precision.

Why untied embeddings: the tiny vocabulary makes tying save almost nothing, and untied weights
keep every parameter a distinct tensor, so plain ``state_dict`` copies (staleness ring, warm-start
cache) never have to reason about shared storage.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

from harness.core.configtools import is_device_name
from harness.model.options import LoraOptions, ModelOptions, TinyModelConfig

# The tiny tokenizer's special tokens in id order (0..3), each under the keyword
# PreTrainedTokenizerFast takes it by.
SPECIAL_TOKEN_ROLES = {
    "pad_token": "<pad>",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "unk_token": "<unk>",
}
SPECIAL_TOKENS = tuple(SPECIAL_TOKEN_ROLES.values())
# Printable ASCII (space .. '~') plus newline: digits, letters and every symbol a task prompt or a
# JSONL answer is likely to use. Fixed order => fixed ids on every machine.
CHARS = tuple(chr(c) for c in range(32, 127)) + ("\n",)
# Attention kernel for the tiny model's HF forward (the training pass). "eager" and "sdpa" are
# both deterministic on CPU and measured equally fast at this size (fwd+bwd of 128x42 tokens:
# ~190 ms either way); sampling bypasses it through harness.sampling.decoders.
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
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=SPECIAL_TOKEN_ROLES["unk_token"]))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        **SPECIAL_TOKEN_ROLES,
        padding_side="left",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    return fast


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout probability in ``model`` to 0; returns how many settings changed.

    Why: PPO compares log-probs of the same weights in different passes (sampling, recompute,
    update); live dropout makes them differ (GPT-2 with 0.1: ratio in [0.86, 1.26] where it must
    be 1). verl and OpenRLHF zero dropout for the same reason. Covers ``nn.Dropout`` modules,
    float attributes named like ``*dropout*``/``*pdrop*``/``layerdrop`` on modules (attention
    modules read them at forward time) and on the config (and its sub-configs). LoRA dropout
    layers added later by ``peft`` are not touched.
    """
    changed = 0

    def is_drop(name: str) -> bool:
        n = name.lower()
        return "dropout" in n or "pdrop" in n or n == "layerdrop"

    for mod in model.modules():
        if isinstance(mod, torch.nn.Dropout) and mod.p != 0.0:
            mod.p = 0.0
            changed += 1
        for name, value in list(vars(mod).items()):
            if is_drop(name) and isinstance(value, float) and value != 0.0:
                setattr(mod, name, 0.0)
                changed += 1
    configs = [getattr(model, "config", None)]
    while configs:
        c = configs.pop()
        if c is None:
            continue
        for name, value in list(vars(c).items()):
            if is_drop(name) and isinstance(value, float) and value != 0.0:
                setattr(c, name, 0.0)
                changed += 1
            elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
                configs.append(value)
    return changed


def autocast_dtype(dtype: str) -> torch.dtype | None:
    """``"bfloat16"`` -> ``torch.bfloat16`` (autocast on); ``"float32"`` -> None (autocast off)."""
    return torch.bfloat16 if dtype == "bfloat16" else None


@contextlib.contextmanager
def precision(device: torch.device | str, dtype: torch.dtype | None) -> Iterator[None]:
    """The one precision context of every forward pass: autocast to ``dtype`` or explicitly off.

    Explicitly off (not just absent) so an outer autocast can never leak into a float32 run.
    """
    dev_type = torch.device(device).type
    with torch.autocast(
        device_type=dev_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None
    ):
        yield


# The config fields that state a model's position limit: GPT-2's name, most models', two others.
POSITION_KEYS = ("n_positions", "max_position_embeddings", "max_sequence_length", "seq_length")


def max_positions(config: Any) -> int | None:
    """The longest sequence a model config supports (prompt + completion), None if unstated."""
    for name in POSITION_KEYS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS plus ``generation_config.eos_token_id``
    (an int or a list: instruct models stop on several, e.g. ``<|im_end|>`` and ``<|endoftext|>``).
    """
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    cand = [tokenizer.eos_token_id, getattr(gen, "eos_token_id", None)]
    for c in cand:
        for i in c if isinstance(c, (list, tuple)) else [c]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return ids


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer trunk of a causal LM, whatever its attribute name (``.model`` for Llama,
    ``.transformer`` for GPT-2, ``.gpt_neox`` for GPT-NeoX); unwraps a ``peft`` model first."""
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        model = get_base()
    trunk = getattr(model, "base_model", None)
    if not isinstance(trunk, torch.nn.Module) or trunk is model:
        raise ValueError(
            f"the critic needs a causal LM with a transformer trunk; {type(model).__name__} has none"
        )
    return trunk


def build_model(
    tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig | None = None, seed: int = 0
) -> LlamaForCausalLM:
    """A randomly initialised tiny Llama sized to ``tokenizer``; the same seed gives the same weights.

    Initialisation runs inside ``torch.random.fork_rng`` so the caller's global RNG state is left
    exactly as it was (building a model must not shift the sampling stream of a run).
    """
    config = tiny_llama_config(tokenizer, cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model = model.to(torch.float32)  # type: ignore[arg-type]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.eval()
    disable_dropout(model)  # no dropout anywhere: sampling and training see the same function
    return model


def tiny_llama_config(
    tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig | None = None
) -> LlamaConfig:
    """The ``LlamaConfig`` of the tiny model (what :func:`build_model` builds, and what
    :mod:`harness.config.resources` sizes before anything is allocated)."""
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
    return config


def resolve_device(spec: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` -> a device; asking for a missing GPU is an error."""
    s = spec.strip().lower()
    if s == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if s == "cpu":
        return torch.device("cpu")
    if is_device_name(s, allow_auto=False):  # cuda or cuda:N (cpu returned above)
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


def load_tokenizer(
    spec: str = "tiny", *, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """The tokenizer for ``spec``: the built-in character tokenizer, or the directory's own one.

    A loaded tokenizer without a pad token pads with EOS; padding is always on the left.
    """
    if spec == "tiny":
        return build_tokenizer()
    if not Path(spec).is_dir():
        raise _missing_dir_error(spec)
    tok = AutoTokenizer.from_pretrained(
        spec, local_files_only=True, trust_remote_code=trust_remote_code
    )
    # transformers 5 builds an *empty* tokenizer (one token, every text → no ids) for a
    # directory with config.json but no tokenizer files; rollout then fails deep inside a
    # reshape. A real tokenizer encodes a probe text to at least one id.
    if not tok("0 a", add_special_tokens=False)["input_ids"]:
        raise ValueError(
            f"model: cannot load a tokenizer from '{spec}' (no tokenizer files there, e.g. "
            "tokenizer.json or tokenizer.model; save one with tokenizer.save_pretrained(DIR))"
        )
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
    options: ModelOptions | None = None,
) -> PreTrainedModel:
    """The model for ``spec`` on ``device``, in eval mode, every dropout zeroed, float32 weights.

    ``tiny`` only shapes the ``"tiny"`` model; ``seed`` only seeds its random initialisation.
    ``options`` picks the attention kernel and ``trust_remote_code`` of a directory; LoRA and
    gradient checkpointing are applied by :func:`prepare_for_training`.
    """
    opts = options or ModelOptions()
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    if spec == "tiny":
        model: PreTrainedModel = build_model(tokenizer, tiny, seed=seed)
    else:
        if not Path(spec).is_dir():
            raise _missing_dir_error(spec)
        kw: dict[str, Any] = {
            "local_files_only": True,
            "dtype": torch.float32,
            "trust_remote_code": opts.trust_remote_code,
        }
        try:
            model = AutoModelForCausalLM.from_pretrained(
                spec, attn_implementation=opts.attn_implementation, **kw
            )
        except ValueError as err:
            # Some architectures (Gemma2: logit soft-capping) have no SDPA kernel in transformers.
            if opts.attn_implementation != "sdpa" or "attention implementation" not in str(err):
                raise
            warnings.warn(
                f"model: {spec} does not support attn_implementation=sdpa; using eager",
                UserWarning,
                stacklevel=2,
            )
            model = AutoModelForCausalLM.from_pretrained(spec, attn_implementation="eager", **kw)
        disable_dropout(model)
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
    options: ModelOptions | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``"tiny"`` (built in code) or a local Hugging Face causal-LM directory -> (model, tokenizer).

    Only local files are read (``local_files_only=True``): the harness never downloads weights.
    """
    if spec != "tiny" and not Path(spec).is_dir():
        raise _missing_dir_error(spec)
    opts = options or ModelOptions()
    tokenizer = load_tokenizer(spec, trust_remote_code=opts.trust_remote_code)
    model = load_model(spec, tokenizer, seed=seed, device=device, tiny=tiny, options=opts)
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


def params_finite(model: torch.nn.Module) -> bool:
    """All parameters finite, checked with one fused norm over every tensor (not one per tensor)."""
    norms = torch._foreach_norm([p.detach() for p in model.parameters()])
    return bool(torch.isfinite(torch.stack(norms)).all())


__all__ = [
    "CHARS",
    "LoraOptions",
    "ModelOptions",
    "autocast_dtype",
    "base_model",
    "disable_dropout",
    "eos_ids",
    "POSITION_KEYS",
    "max_positions",
    "params_finite",
    "precision",
    "SPECIAL_TOKENS",
    "TinyModelConfig",
    "build_model",
    "build_tokenizer",
    "tiny_llama_config",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "model_fingerprint",
    "resolve_device",
]
