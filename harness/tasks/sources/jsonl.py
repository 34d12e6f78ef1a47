"""``jsonl:PATH``: ``{"prompt", "answer"}`` lines, exact or numeric match."""

from __future__ import annotations

from harness.tasks.pairs import PairOptions, PairTask, pair_file_source, pair_file_task
from harness.tasks.records import read_jsonl
from harness.tasks.registry import register


def jsonl_task(spec: str, path: str, o: PairOptions) -> PairTask:
    """``jsonl:PATH``: by default exact match, or numeric match within 1e-6 when both sides are
    numbers, of the whole completion; ``reward``/``answer_format``/``format_weight``/``think``
    as in :mod:`harness.tasks.answers`; ``max_*`` bound the data
    (:class:`harness.tasks.pairs.DataLimitOptions`)."""
    return pair_file_task(spec, path, o, read_jsonl)


register(
    pair_file_source(
        "jsonl:PATH",
        '`{"prompt", "answer"}` lines; exact or numeric (1e-6) match',
        jsonl_task,
        rank=10,
        field_help="JSONL lines {prompt, answer}",
    )
)
