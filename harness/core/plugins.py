"""Registries that grow by file: a package whose every module registers itself on import.

The objectives (``harness.ppo.objectives``), the correction families
(``harness.ppo.corrections``) and the task sources (``harness.tasks.sources``) are such
packages: adding one is one new file, which nothing else has to name.  The order of import is
the modules' names; what a registry lists is ordered by its own declarations (a rank), never by
import order.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Collection, Iterable


def import_members(package: str, path: Iterable[str], *, skip: Collection[str] = ()) -> list[str]:
    """Import every module of ``package`` (found on ``path``, the package's ``__path__``) whose
    name is not in ``skip``, in name order; return the imported names.

    An error raised by a member (a typo, a declaration twice) propagates: a registry that
    silently lost a member would offer less than its docs say."""
    names = sorted(m.name for m in pkgutil.iter_modules(list(path)) if m.name not in skip)
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names
