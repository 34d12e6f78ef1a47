"""The task sources (``task:``): one module per source, registered on import.

Every module of this package is imported here, so a new source is one new file that calls
``registry.register`` (plus its tests); nothing else names it.  :mod:`harness.tasks.registry`
says what a declaration holds and what is derived from it.
"""

from __future__ import annotations

from harness.core.plugins import import_members

import_members(__name__, __path__)
