"""Checks a run's inputs against the model and the machine before anything runs (exit 2).

Why here and not at the first forward: GPT-2 past ``n_positions`` dies with an ``IndexError``
deep in the embedding lookup, and RoPE models silently run past ``max_position_embeddings``
(quality falls off a cliff, nothing fails). Reading ``config.json`` and tokenizing a probe of
the task's prompts costs well under a second and turns both into one line naming the field.

Every reader of user files is bounded too, before it parses (a 200 MB YAML file took over a
minute; one 2 MB prompt padded into a batch with 320 others took 23 GB): the sizes below are
stated in the README. The probe tokenizes one prompt at a time, so it costs O(one prompt).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig

from harness.config.prompt_probe import Probe, example_where, probe_prompts
from harness.config.resources import (
    available_memory,
    check_model_memory,
    check_weights,
    memory_check_off,
    tiny_model_config,
)
from harness.core.limits import (
    MAX_MODEL_CONFIG_BYTES,
    file_too_big,
    not_regular,
)
from harness.model.build import load_tokenizer, max_positions
from harness.model.checkpoint import (
    declared_architecture_problem,
    position_problem,
    weights_problem,
)
from harness.model.engine_memory import kv_bytes_per_token
from harness.model.engine_support import (
    INSTALL_HINT,
    cpu_head_size_problem,
    engine_dtype,
    engine_installed,
    head_size,
    served_architecture,
)

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.tasks import Task


def refuse_special_files(model_dir: Path) -> None:
    """Refuse a model directory holding a FIFO, socket or device where a file belongs (its
    ``config.json``, tokenizer or weights): the loaders would open it and block for ever on a
    FIFO.  Checked by ``stat`` only, before anything in the directory is opened."""
    try:
        entries = list(os.scandir(model_dir))
    except OSError:
        return  # a missing or unreadable directory is reported by the loader, with its reason
    for entry in entries:
        if entry.is_dir():
            continue
        kind = not_regular(entry.path)
        if kind is not None:
            raise ValueError(f"model: {entry.path} is {kind}, not a regular file")


def model_config(cfg: RunConfig) -> Any:
    """The HF config of ``cfg.model`` (a directory), its ``config.json`` size-checked first."""
    refuse_special_files(Path(cfg.model))
    too_big = file_too_big(Path(cfg.model) / "config.json", MAX_MODEL_CONFIG_BYTES, "config.json")
    if too_big:
        raise ValueError(f"model: {too_big}")
    try:
        config = AutoConfig.from_pretrained(
            cfg.model,
            local_files_only=True,
            trust_remote_code=cfg.model_options.trust_remote_code,
        )
    except Exception as err:  # a user's file: any failure to read it is a config error
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        first = " ".join(lines)[:300] if lines else type(err).__name__
        if isinstance(err, (ValueError, OSError)) and lines:
            first = lines[0]
        if "trust_remote_code" in str(err):
            first = "the directory ships its own modeling code; set model_options.trust_remote_code=true to run it"
        raise ValueError(f"model: cannot read {cfg.model!r}: {first}") from None
    # Checked on every read, so that a grid's memory check and the engine's see the same model
    # the learner loads: a limit that is no limit, an architecture that is not the model_type's.
    why = position_problem(config) or declared_architecture_problem(config)
    if why is not None:
        raise ValueError(f"model: {cfg.model!r}: {why}")
    return config


def model_limit(cfg: RunConfig, config: Any | None = None) -> tuple[int | None, str]:
    """(longest supported sequence, where it comes from) for ``cfg.model``."""
    if cfg.model == "tiny":
        return cfg.tiny.max_position_embeddings, "tiny.max_position_embeddings"
    mc = config if config is not None else model_config(cfg)
    return max_positions(mc), f"{type(mc).__name__} position limit"


def check_special_ids(
    cfg: RunConfig, tokenizer: Any, config: Any, probe: Probe, task: Task
) -> None:
    """Every id a run feeds the model must be a row of its embedding: a tokenizer without pad
    and eos tokens gets a default one added one past the vocabulary (an ``IndexError`` in the
    first forward)."""
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab <= 0:
        return
    for name in ("pad_token", "eos_token", "bos_token"):
        tid = getattr(tokenizer, f"{name}_id", None)
        if isinstance(tid, int) and tid >= vocab:
            raise ValueError(
                f"model: the tokenizer in {cfg.model!r} gives {name} "
                f"{getattr(tokenizer, name)!r} id {tid}, outside the model's {vocab}-token "
                "vocabulary (config.json vocab_size); give the tokenizer pad and eos tokens "
                "the model knows"
            )
    top, ex = probe.top["id"]
    if top >= vocab:
        raise ValueError(
            f"{example_where(task, ex) or 'task: '}prompt {ex.prompt[:40]!r} tokenizes to id "
            f"{top}, outside the model's {vocab}-token vocabulary (config.json vocab_size)"
        )


def check_memory(cfg: RunConfig) -> None:
    """Raise ``ValueError`` (one line) when ``cfg``'s model cannot fit this machine's memory
    (harness.config.resources); for a grid cell whose axes together make the model large."""
    check_model_memory(cfg, None if cfg.model == "tiny" else model_config(cfg))


# The architectures harness.run.decoders' functional decoder replays (the tiny model is Llama).
FAST_DECODER_TYPES = ("llama", "qwen2", "mistral")


def check_sampler_backend(cfg: RunConfig, config: Any | None) -> None:
    """``rollout.sampler_backend: fast`` on a model the functional decoder cannot replay is a
    config error now, not a failed run at the first rollout."""
    if cfg.rollout.sampler_backend != "fast" or config is None:
        return
    kind = str(getattr(config, "model_type", ""))
    windowed = getattr(config, "sliding_window", None) is not None and (
        kind == "mistral" or bool(getattr(config, "use_sliding_window", False))
    )
    if kind not in FAST_DECODER_TYPES or windowed:
        what = f"{kind} with sliding-window attention" if windowed else kind or "this model"
        raise ValueError(
            f"rollout.sampler_backend: fast needs a Llama, Qwen2 or Mistral model without "
            f"sliding-window attention, not {what}; use auto or hf"
        )


def _cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def check_engine(cfg: RunConfig, config: Any | None) -> None:
    """``rollout.sampler_backend: vllm``: the engine is installed and serves the model's
    architecture, checked now rather than at the first rollout."""
    if cfg.rollout.sampler_backend != "vllm":
        return
    if not engine_installed():
        raise ValueError(f"rollout.sampler_backend: vllm needs {INSTALL_HINT}")
    on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not _cuda_available())
    if on_cpu:
        tiny = cfg.tiny
        size = tiny.hidden_size // tiny.num_heads if config is None else head_size(config)
        why = cpu_head_size_problem(size)
        if why is not None:
            where = "tiny.num_heads / tiny.hidden_size" if config is None else "model"
            raise ValueError(f"rollout.sampler_backend: vllm on {where}: {why}; use auto")
        check_engine_kv_cache(cfg, config)
    if config is None:  # the built-in model is a plain Llama, which the engine serves
        return
    if served_architecture(config) is None:
        archs = ", ".join(getattr(config, "architectures", None) or ["(none named)"])
        raise ValueError(
            f"rollout.sampler_backend: vllm cannot serve this model's architecture {archs} "
            "(not in the engine's model registry); use auto"
        )


GIB = 1 << 30


def check_engine_kv_cache(cfg: RunConfig, config: Any | None) -> None:
    """``rollout.engine_kv_cache_gib`` (the CPU engine's KV cache space) must fit this machine's
    memory, and must hold one sequence of the model's full length: the engine is started with
    the model's position limit as its longest sequence and refuses to start otherwise
    (harness.model.engine_memory)."""
    gib = cfg.rollout.engine_kv_cache_gib
    if not memory_check_off():
        ram, bound = available_memory()
        if ram is not None and gib * GIB > ram:
            raise ValueError(
                f"rollout.engine_kv_cache_gib: {gib:,} GiB is more than this machine's memory "
                f"({ram / GIB:,.1f} GiB {bound}); lower it, or set HARNESS_MEMORY_CHECK=off to "
                "skip the comparison"
            )
    model = config if config is not None else tiny_model_config(cfg)
    dtype = engine_dtype(cfg.rollout.sampler_dtype, cfg.model_options.dtype)
    limit, per_token = max_positions(model), kv_bytes_per_token(model, dtype)
    if limit is None or not per_token or limit * per_token <= gib * GIB:
        return
    need = limit * per_token
    where = "tiny.max_position_embeddings" if config is None else "config.json"
    raise ValueError(
        f"rollout.engine_kv_cache_gib: the engine starts only if the KV cache of one sequence "
        f"of the model's {limit:,} positions ({where}) fits: {need / GIB:,.2f} GiB "
        f"({per_token:,} bytes a token in {dtype}), more than the {gib} GiB reserved; set it "
        f"to {need // GIB + 1} or lower the model's position limit"
    )


def check_lengths(cfg: RunConfig, task: Task) -> None:
    """Raise ``ValueError`` (one line) when the model cannot hold prompt + max_new_tokens, does
    not fit in memory, its tokenizer gives ids it does not have, or an option needs something
    missing (peft for LoRA)."""

    if cfg.model_options.lora is not None and importlib.util.find_spec("peft") is None:
        raise ValueError(
            "model_options.lora: needs the optional peft package (pip install -e '.[lora]')"
        )
    config = None if cfg.model == "tiny" else model_config(cfg)
    if config is not None:  # before the samplers' checks: they trust the config's architecture
        why = weights_problem(
            cfg.model, config, trust_remote_code=cfg.model_options.trust_remote_code
        )
        if why is not None:
            raise ValueError(f"model: {why}")
    check_sampler_backend(cfg, config)
    check_engine(cfg, config)
    limit, where = model_limit(cfg, config)
    check_model_memory(cfg, config)
    try:
        tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.model_options.trust_remote_code)
    except (ValueError, OSError) as err:  # e.g. a directory with config.json but no tokenizer
        first = str(err).splitlines()[0].strip() if str(err) else type(err).__name__
        if first.startswith("model"):
            raise
        raise ValueError(f"model: cannot load a tokenizer from {cfg.model!r} ({first})") from None
    if config is not None:
        check_weights(cfg.model)
    probe = probe_prompts(cfg, task, tokenizer)  # also renders the chat template
    if config is not None:
        check_special_ids(cfg, tokenizer, config, probe, task)
    new = cfg.rollout.max_new_tokens
    if limit is None:
        return
    if new >= limit:
        raise ValueError(
            f"rollout.max_new_tokens: {new} leaves no room for a prompt in the model's "
            f"{limit} positions ({where})"
        )
    longest, ex = probe.top["prompt"]
    if longest + new > limit:
        source = example_where(task, ex)
        fix = f"lower it or set rollout.max_prompt_tokens <= {limit - new}"
        if source:  # one row of a file: name it
            raise ValueError(
                f"{source}prompt of {longest:,} tokens + rollout.max_new_tokens {new} exceeds "
                f"the model's {limit} positions ({where}); shorten it or set "
                f"rollout.max_prompt_tokens <= {limit - new}"
            )
        raise ValueError(
            f"rollout.max_new_tokens: prompts of up to {longest} tokens + {new} new tokens "
            f"exceed the model's {limit} positions ({where}); {fix}"
        )
    if "warm" in probe.top and probe.top["warm"][0] > limit:
        # The warm start feeds whole prompts (max_prompt_tokens does not apply there).
        warm, ex = probe.top["warm"]
        raise ValueError(
            f"warm_start.steps: {example_where(task, ex)}prompt {ex.prompt[:40]!r} + its "
            f"demonstration + EOS is {warm:,} tokens, more than the model's {limit} positions "
            f"({where}); the warm start does not truncate prompts: shorten the row or set "
            "warm_start.steps=0"
        )


__all__ = [
    "check_engine",
    "check_engine_kv_cache",
    "check_lengths",
    "check_memory",
    "check_sampler_backend",
    "model_config",
    "model_limit",
]
