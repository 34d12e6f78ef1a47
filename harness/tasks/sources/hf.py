"""``hf:PATH``: a local ``save_to_disk`` directory, ``.parquet`` or ``.jsonl`` file; nothing is
downloaded (:mod:`harness.tasks.local_data`)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.fields import option
from harness.tasks.base import Task
from harness.tasks.pairs import PairOptions
from harness.tasks.registry import TaskOptions, TaskSource, register


@dataclass(frozen=True)
class _Columns(TaskOptions):
    prompt_field: str = option("prompt", "the prompt column.")
    answer_field: str = option("answer", "the answer column.")
    split: str | None = option(None, "the split of a DatasetDict directory (default train).")


# The columns first, then the scoring options of jsonl: (a dataclass lists its bases' fields
# from the last base to the first).
@dataclass(frozen=True)
class HfOptions(PairOptions, _Columns):
    pass


def _build(spec: str, path: str, options: HfOptions) -> Task:
    from harness.tasks.local_data import hf_task  # noqa: PLC0415 - loads pyarrow: only when an hf: task is built

    return hf_task(spec, path, options)


register(
    TaskSource(
        form="hf:PATH",
        summary="a local `save_to_disk` directory, `.parquet` or `.jsonl` file, columns named by "
        "`prompt_field`, `answer_field`; scored as `jsonl:`; never downloads",
        build=_build,
        options=HfOptions,
        rank=20,
        field_help=None,
    )
)
