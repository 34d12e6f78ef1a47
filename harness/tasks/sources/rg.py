"""``rg:NAME``: a reasoning-gym generator scored by its own verifier
(:mod:`harness.tasks.reasoning`)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.fields import option
from harness.tasks.answers import AnswerFormat, AnswerOptions
from harness.tasks.reasoning import reasoning_task
from harness.tasks.registry import TaskSource, register


@dataclass(frozen=True)
class RgOptions(AnswerOptions):
    # A prompt of rg: asks for the tag, so that is where the answer is read.
    answer_format: AnswerFormat = option(
        "tag", "where the answer is: whole completion, <answer> tag, last line."
    )
    eval_size: int = option(128, "items in the held-out pool.", ge=1, le=100_000)


def _name(spec: str, name: str) -> str:
    if not name.strip():
        raise ValueError(f"task '{spec}': expected rg:NAME (a reasoning-gym generator)")
    return name.strip()


register(
    TaskSource(
        form="rg:NAME",
        summary="a reasoning-gym generator scored by its own verifier; nothing is downloaded",
        build=lambda spec, name, o, fields: reasoning_task(spec, name, {**fields, **o.values()}),
        options=RgOptions,
        rank=30,
        argument=_name,
        # The generator's config fields, checked against its dataclass by reasoning_task.
        further={
            "seed": (0, "seed of the training and held-out pools (not the run seed)."),
            "size": (None, "items in the training pool (null: the generator's own, 500 for most)."),
            "*": (
                None,
                "any other field of the generator's config dataclass (e.g. countdown's "
                "min_numbers), checked against its type.",
            ),
        },
        field_help=None,
    )
)
