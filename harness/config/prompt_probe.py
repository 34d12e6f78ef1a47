"""The prompt probe of the preflight checks: the task's evaluation prompts, a seeded draw of
training prompts and a file task's extreme rows, each rendered with the chat template and
tokenized one at a time; the longest prompt, the largest token id and the longest warm-start
sequence are kept with the example each came from (:class:`Probe`).  A grid's cells share one
probe per distinct prompt setting (:mod:`harness.config.probe_scope`)."""

from __future__ import annotations

import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.config.probe_scope import shared_probe_cache
from harness.core import limits
from harness.core.limits import RenderTimeout, time_bound
from harness.model.prompting import apply_chat_template, resolve_chat_template

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.tasks import Example, Task

# Prompts tokenized to estimate the longest prompt: every eval prompt plus this many training
# draws (a task's prompts come from one generator, so the probe sees its length range), plus a
# file task's longest and shortest prompts by characters (so one outlier row is never missed).
PROBE_PROMPTS = 256
PROBE_EXTREMES = 8


@dataclass
class Probe:
    """The tokenized probe: per measure, the largest value seen and the example it came from.

    Measures: ``prompt`` (tokens after the template and truncation, what rollouts feed the
    model), ``warm`` (untruncated prompt + demonstration + EOS, what the warm start feeds it) and
    ``id`` (the largest token id of a kept prompt)."""

    top: dict[str, tuple[int, Example]] = field(default_factory=dict)

    def see(self, measure: str, value: int, ex: Example) -> None:
        if measure not in self.top or value > self.top[measure][0]:
            self.top[measure] = (value, ex)

    @property
    def longest(self) -> int:
        return self.top["prompt"][0]


class _ProbeTimeout(BaseException):
    """Drawing the probed prompts ran past ``TASK_PROBE_SECONDS`` (a BaseException: a task
    generator's own ``except Exception`` must not swallow it)."""


def _probe_examples(cfg: RunConfig, task: Task) -> list[Example]:
    """The probed examples, drawn within ``TASK_PROBE_SECONDS`` (a generator whose options make
    every item take seconds would otherwise validate for hours)."""
    bound = limits.TASK_PROBE_SECONDS
    start = time.monotonic()
    try:
        with time_bound(bound, _ProbeTimeout):
            examples = _draw_probe(cfg, task)
        if time.monotonic() - start <= bound:
            return examples
    except _ProbeTimeout:
        pass
    raise ValueError(
        f"task '{task.name}': drawing the {cfg.eval.n_prompts} evaluation prompts and "
        f"{PROBE_PROMPTS} training draws the validation probe reads took more than {bound:g} s; "
        "lower the options that make the task's items slow to generate"
    )


def _draw_probe(cfg: RunConfig, task: Task) -> list[Example]:
    examples = list(task.eval_examples(cfg.eval.n_prompts))
    examples += task.sample(random.Random(cfg.seed), PROBE_PROMPTS)
    extremes = getattr(task, "extreme_examples", None)
    if callable(extremes):
        examples += extremes(PROBE_EXTREMES)
    seen: set[tuple[str, str]] = set()
    out = []
    for ex in examples:
        if (ex.prompt, ex.answer) not in seen:
            seen.add((ex.prompt, ex.answer))
            out.append(ex)
    return out


def example_where(task: Task, ex: Example) -> str:
    """``task 'NAME': SOURCE: `` for an example read from a file row, else ``""``."""
    return f"task '{task.name}': {ex.source}: " if ex.source else ""


def _probe_key(cfg: RunConfig, task: Task) -> str:
    """Everything ``probe_prompts`` reads from ``cfg`` and the task spec."""
    return json.dumps(
        [
            cfg.model,
            cfg.model_options.trust_remote_code,
            cfg.task,
            cfg.task_options,
            getattr(task, "name", None),
            cfg.rollout.chat_template,
            cfg.rollout.max_prompt_tokens,
            cfg.eval.n_prompts,
            cfg.seed,
            cfg.warm_start.steps > 0,
        ],
        sort_keys=True,
        default=repr,
    )


def probe_prompts(cfg: RunConfig, task: Task, tokenizer: Any) -> Probe:
    """Tokenize the probed prompts one at a time (after the chat template and truncation).

    Raises ``ValueError`` (one line) for a template that fails or takes too long to render and
    for a prompt that becomes no tokens at all (an empty template, an empty prompt)."""
    shared = shared_probe_cache()
    if shared is None:
        return _probe_prompts(cfg, task, tokenizer)
    key = _probe_key(cfg, task)
    if key not in shared:
        shared[key] = _probe_prompts(cfg, task, tokenizer)
    return shared[key]


def _probe_prompts(cfg: RunConfig, task: Task, tokenizer: Any) -> Probe:
    template = resolve_chat_template(cfg.rollout.chat_template, tokenizer)
    special = template is None
    keep = cfg.rollout.max_prompt_tokens
    probe = Probe()
    budget = limits.TEMPLATE_RENDER_SECONDS  # for rendering only: tokenizing is bounded by the text
    try:
        for ex in _probe_examples(cfg, task):
            start = time.monotonic()
            with time_bound(budget) if template is not None else contextlib.nullcontext():
                (text,) = apply_chat_template(tokenizer, [ex.prompt], template)
            if template is not None:  # only rendering is the template's: not a long prompt
                budget -= time.monotonic() - start
                if budget <= 0:
                    raise RenderTimeout
            full = tokenizer(text, add_special_tokens=special, verbose=False)["input_ids"]
            ids = full[-keep:] if keep is not None else full
            if not ids:
                what = "the chat template renders it as" if template else "it is"
                raise ValueError(
                    f"{example_where(task, ex) or 'task: '}prompt {ex.prompt[:40]!r}: {what} no "
                    "tokens (a prompt must be at least one token)"
                )
            probe.see("prompt", len(ids), ex)
            probe.see("id", max(ids), ex)
            if cfg.warm_start.steps > 0:
                demo = task.demonstration(ex)
                n = len(tokenizer(demo, add_special_tokens=False, verbose=False)["input_ids"])
                probe.see("warm", len(full) + n + 1, ex)
    except RenderTimeout:
        raise ValueError(
            f"rollout.chat_template: rendering the probed prompts took more than "
            f"{limits.TEMPLATE_RENDER_SECONDS:g} s (a runaway loop in the template?)"
        ) from None
    except ValueError:
        raise
    except Exception as err:  # a broken Jinja template: jinja2's own error types
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"rollout.chat_template: cannot render a prompt ({first})") from None
    if "prompt" not in probe.top:
        raise ValueError(f"task '{task.name}': has no prompts")
    return probe


def longest_prompt(cfg: RunConfig, task: Task, tokenizer: Any) -> int:
    """Tokens in the longest probed prompt (eval prompts + training draws), after truncation."""
    return probe_prompts(cfg, task, tokenizer).longest


__all__ = ["Probe", "example_where", "longest_prompt", "probe_prompts"]
