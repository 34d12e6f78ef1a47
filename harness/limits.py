"""Checks a run's model options against the model before anything runs (config errors, exit 2).

Why here and not at the first forward: GPT-2 past ``n_positions`` dies with an ``IndexError``
deep in the embedding lookup, and RoPE models silently run past ``max_position_embeddings``
(quality falls off a cliff, nothing fails). Reading ``config.json`` and tokenizing a probe of
the task's prompts costs well under a second and turns both into one line naming the field.
"""

from __future__ import annotations

import importlib.util
import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.tasks import Task

# Prompts tokenized to estimate the longest prompt: every eval prompt plus this many training
# draws (a task's prompts come from one generator, so the probe sees its length range).
PROBE_PROMPTS = 256


def model_limit(cfg: RunConfig) -> tuple[int | None, str]:
    """(longest supported sequence, where it comes from) for ``cfg.model``."""
    from harness.models import max_positions

    if cfg.model == "tiny":
        return cfg.tiny.max_position_embeddings, "tiny.max_position_embeddings"
    from transformers import AutoConfig

    try:
        mc = AutoConfig.from_pretrained(
            cfg.model,
            local_files_only=True,
            trust_remote_code=cfg.model_options.trust_remote_code,
        )
    except (ValueError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "trust_remote_code" in str(err):
            first = "the directory ships its own modeling code; set model_options.trust_remote_code=true to run it"
        raise ValueError(f"model: cannot read {cfg.model!r}: {first}") from None
    limit = max_positions(mc)
    return limit, f"{type(mc).__name__} position limit"


def longest_prompt(cfg: RunConfig, task: Task, tokenizer: Any) -> int:
    """Tokens in the longest probed prompt (eval prompts + training draws), after truncation."""
    from harness.prompting import resolve_chat_template
    from harness.rollout import encode_prompts

    prompts = [e.prompt for e in task.eval_examples(cfg.eval.n_prompts)]
    prompts += [e.prompt for e in task.sample(random.Random(cfg.seed), PROBE_PROMPTS)]
    try:
        template = resolve_chat_template(cfg.rollout.chat_template, tokenizer)
        enc = encode_prompts(tokenizer, prompts, cfg.rollout.max_prompt_tokens, template)
    except ValueError:
        raise
    except Exception as err:  # a broken Jinja template: jinja2's own error types
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"rollout.chat_template: cannot render a prompt ({first})") from None
    return int(enc["attention_mask"].sum(-1).max())


def check_lengths(cfg: RunConfig, task: Task) -> None:
    """Raise ``ValueError`` (one line) when the model cannot hold prompt + max_new_tokens, or an
    option needs something missing (peft for LoRA)."""
    from harness.models import load_tokenizer

    if cfg.model_options.lora is not None and importlib.util.find_spec("peft") is None:
        raise ValueError(
            "model_options.lora: needs the optional peft package (pip install -e '.[lora]')"
        )
    limit, where = model_limit(cfg)
    try:
        tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.model_options.trust_remote_code)
    except (ValueError, OSError) as err:  # e.g. a directory with config.json but no tokenizer
        first = str(err).splitlines()[0].strip() if str(err) else type(err).__name__
        if first.startswith("model"):
            raise
        raise ValueError(f"model: cannot load a tokenizer from {cfg.model!r} ({first})") from None
    longest = longest_prompt(cfg, task, tokenizer)  # also renders the chat template once
    new = cfg.rollout.max_new_tokens
    if limit is None:
        return
    if new >= limit:
        raise ValueError(
            f"rollout.max_new_tokens: {new} leaves no room for a prompt in the model's "
            f"{limit} positions ({where})"
        )
    if longest + new > limit:
        raise ValueError(
            f"rollout.max_new_tokens: prompts of up to {longest} tokens + {new} new tokens "
            f"exceed the model's {limit} positions ({where}); lower it or set "
            f"rollout.max_prompt_tokens <= {limit - new}"
        )


__all__ = ["check_lengths", "longest_prompt", "model_limit"]
