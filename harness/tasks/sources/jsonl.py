"""``jsonl:PATH``: ``{"prompt", "answer"}`` lines, exact or numeric match."""

from __future__ import annotations

from harness.tasks.pairs import PairOptions, PairTask, answer_options, file_task
from harness.tasks.records import file_digest, read_jsonl
from harness.tasks.registry import TaskSource, nonempty_argument, register


def jsonl_task(spec: str, path: str, o: PairOptions) -> PairTask:
    """``jsonl:PATH``: by default exact match, or numeric match within 1e-6 when both sides are
    numbers, of the whole completion; ``reward``/``answer_format``/``format_weight``/``think``
    as in :mod:`harness.tasks.answers`; ``max_*`` bound the data
    (:class:`harness.tasks.pairs.DataLimitOptions`)."""
    scoring = answer_options(spec, o)
    examples = read_jsonl(spec, path, bounds=o.bounds())
    return file_task(spec, o, examples, scoring, file_digest(path))


register(
    TaskSource(
        form="jsonl:PATH",
        summary='`{"prompt", "answer"}` lines; exact or numeric (1e-6) match',
        build=jsonl_task,
        options=PairOptions,
        rank=10,
        argument=nonempty_argument("jsonl:PATH"),
        field_help="JSONL lines {prompt, answer}",
    )
)
