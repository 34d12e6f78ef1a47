"""Rollout samplers behind one contract (:mod:`harness.sampling.base`): the local KV-cache
sampler (``local``) and the vLLM inference engine (``vllm``), registered by name
(:mod:`harness.sampling.registry`).  Imports nothing from ``harness.config``: the run maps its
config onto a backend's options (``harness/run/sampler.py``)."""

from __future__ import annotations

from harness.core.plugins import import_members
from harness.sampling.base import (
    NonFiniteLogits,
    RolloutBatch,
    Sampler,
    SamplingParams,
    assemble_batch,
    encode_prompts,
)
from harness.sampling.registry import BACKENDS, Backend, backend, make_backend, register

# Every other module is a backend that registers itself on import (a new backend is one file).
import_members(__name__, __path__, skip={"admission", "base", "decoders", "registry", "vllm_host"})

__all__ = [
    "BACKENDS",
    "Backend",
    "NonFiniteLogits",
    "RolloutBatch",
    "Sampler",
    "SamplingParams",
    "assemble_batch",
    "backend",
    "encode_prompts",
    "make_backend",
    "register",
]
