"""The scope in which a grid's cells share their prompt probes (``shared_probes``)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.config.prompt_probe import Probe

# While a grid is validated, the cells share one probe per distinct prompt setting: the probe
# tokenizes every probed prompt (most of a cell's check), and a grid's cells usually differ in
# nothing it reads.  Scoped to one validation (``shared_probes``), so nothing outlives the file
# whose tasks it read.  It is a module of its own because the module that fills it
# (harness.config.prompt_probe) loads transformers and is imported only when a task is checked,
# while the experiment loader opens the scope before it knows whether any task is.
_PROBES: contextvars.ContextVar[dict[str, Probe] | None] = contextvars.ContextVar(
    "harness_probes", default=None
)


@contextlib.contextmanager
def shared_probes() -> Iterator[None]:
    """Within the block, ``validate_task`` probes each distinct prompt setting once."""
    token = _PROBES.set({})
    try:
        yield
    finally:
        _PROBES.reset(token)


def shared_probe_cache() -> dict[str, Probe] | None:
    """The probes of the enclosing ``shared_probes`` block, or None outside one."""
    return _PROBES.get()
