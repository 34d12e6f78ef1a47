"""``jsonl:PATH``: ``{"prompt", "answer"}`` lines, exact or numeric match
(:func:`harness.tasks.pairs.jsonl_task`)."""

from __future__ import annotations

from harness.tasks.pairs import PairOptions, jsonl_task
from harness.tasks.registry import TaskSource, register


def _path(spec: str, path: str) -> str:
    if not path:
        raise ValueError(f"task '{spec}': expected jsonl:PATH")
    return path


register(
    TaskSource(
        form="jsonl:PATH",
        summary='`{"prompt", "answer"}` lines; exact or numeric (1e-6) match',
        build=lambda spec, path, o: jsonl_task(spec, path, **o.values()),
        options=PairOptions,
        rank=10,
        argument=_path,
        field_help="JSONL lines {prompt, answer}",
    )
)
