"""The sampler backends by name: each declares its options, its refusals and its preflight check.

A backend is one module of :mod:`harness.sampling` that registers its :class:`Sampler` subclass
with :func:`register` on import; the package imports every member module (the discovery the
objectives, the corrections and the task sources use, :func:`harness.core.plugins.import_members`),
so a new backend is one file that nothing else has to name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.sampling.base import Sampler


@dataclass(frozen=True)
class Backend:
    """A registered backend: ``options`` (name → help) are the fields of its settings value
    (``cls.spec_type``: :class:`~harness.sampling.local.LocalSpec`,
    :class:`~harness.sampling.vllm.EngineSpec`) a run sets from its config;
    ``refuse(settings)`` names the first rollout setting it cannot honour (None: none); ``preflight()`` says why it cannot
    run on this machine (None: it can)."""

    name: str
    cls: type[Sampler]
    options: Mapping[str, str] = field(default_factory=dict)
    refuse: Callable[[Mapping[str, Any]], str | None] | None = None
    preflight: Callable[[], str | None] | None = None


BACKENDS: dict[str, Backend] = {}


def register(
    name: str,
    *,
    options: Mapping[str, str],
    refuse: Callable[[Mapping[str, Any]], str | None] | None = None,
    preflight: Callable[[], str | None] | None = None,
) -> Callable[[type[Sampler]], type[Sampler]]:
    """Class decorator: ``cls`` is the backend ``name`` (a name registered twice is an error:
    two files claiming one backend)."""

    def deco(cls: type[Sampler]) -> type[Sampler]:
        if name in BACKENDS and BACKENDS[name].cls is not cls:
            raise ValueError(f"sampler backend {name!r} registered twice")
        BACKENDS[name] = Backend(name, cls, dict(options), refuse, preflight)
        return cls

    return deco


def backend(name: str) -> Backend:
    """The backend registered as ``name`` (ValueError naming the known ones otherwise)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown sampler backend {name!r} (known: {', '.join(sorted(BACKENDS))})")
    return BACKENDS[name]


def make_backend(name: str, **kwargs: Any) -> Sampler:
    """A new, unstarted sampler of backend ``name``."""
    return backend(name).cls(**kwargs)


__all__ = ["BACKENDS", "Backend", "backend", "make_backend", "register"]
