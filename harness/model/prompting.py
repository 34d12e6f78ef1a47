"""Chat templates: show an instruct model its prompts the way it was trained to see them.

``rollout.chat_template``: ``none`` (default) feeds the task's prompt text as is; ``auto`` wraps
each prompt as one user turn with the tokenizer's own template when it has one (and leaves the
text alone when it has none, e.g. the built-in tiny tokenizer); a path reads a Jinja template
from that file. The rendered text already holds the model's special tokens (BOS, turn
markers), so it is tokenized with ``add_special_tokens=False``, never with a second BOS.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase

from harness.core import limits


def resolve_chat_template(spec: str, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The Jinja template ``spec`` selects for ``tokenizer``, or None for plain prompts."""
    if spec == "none":
        return None
    if spec == "auto":
        template = getattr(tokenizer, "chat_template", None)
        return template if isinstance(template, str) and template else None

    path = Path(spec)
    if not path.is_file():
        raise ValueError(
            f"rollout.chat_template: file {spec!r} not found (use auto, none or a path)"
        )
    try:
        text = limits.read_bounded_text(
            path, limits.MAX_TEMPLATE_BYTES, "a chat template", shown=spec
        )
    except ValueError as err:
        raise ValueError(f"rollout.chat_template: {err}") from None
    if not text.strip():  # renders every prompt as no tokens: an IndexError mid-run
        raise ValueError(f"rollout.chat_template: {spec}: is empty (use none for plain prompts)")
    return text


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], template: str | None
) -> list[str]:
    """Each prompt as one user turn followed by the assistant's generation prompt."""
    if template is None:
        return list(prompts)
    out = []
    for p in prompts:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": p}],
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
        )
        out.append(str(text))
    return out


__all__ = ["apply_chat_template", "resolve_chat_template"]
