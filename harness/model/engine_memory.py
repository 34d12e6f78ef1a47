"""What the inference engine's start allocates on CPU, from the model config alone: the KV cache
it must hold for one sequence of the model's full length.

Why: the engine is started with ``max_model_len`` = the model's position limit (vLLM derives
the same from ``config.json`` when none is given, as under ``trainer: trl``), and vLLM refuses
to start when one request of that length does not fit in the KV cache space
(``VLLM_CPU_KVCACHE_SPACE`` = ``rollout.engine_kv_cache_gib``): "To serve at least one request
with the model's max seq len ... KV cache is needed, which is larger than the available KV
cache memory", 45 s or more into a run.  Per token and layer the cache holds a key and a value
of ``num_key_value_heads x head_size`` elements in the engine's dtype; for the tiny 2-layer
Llama of the tests (1 KV head of 32) that is 512 bytes a token in float32, and vLLM 0.32 asked
1.05 GiB for 2,200,000 positions: the same count.
"""

from __future__ import annotations

from typing import Any

from harness.model.engine_support import head_size

# Bytes per element of the KV cache: the engine's dtype (rollout.sampler_dtype's names).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Architectures whose layers are all attention layers over num_key_value_heads heads (every
# architecture docs/models.md lists, and near kin); others (state-space hybrids, latent
# attention) hold a cache this count would overstate, so they are not estimated.
PLAIN_ATTENTION = frozenset(
    (
        "llama",
        "qwen2",
        "qwen3",
        "mistral",
        "gpt2",
        "opt",
        "gpt_neox",
        "phi",
        "phi3",
        "gemma",
        "gemma2",
    )
)


def _full_attention_layers(config: Any) -> int | None:
    """Layers whose cache grows with the whole sequence (a sliding-window layer's stops at its
    window); None when the count is not known."""
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0:
        return None
    kinds = getattr(config, "layer_types", None)
    if isinstance(kinds, list) and kinds:
        return sum(1 for k in kinds[:layers] if k == "full_attention")
    windowed = getattr(config, "sliding_window", None) is not None and (
        config.model_type == "mistral" or bool(getattr(config, "use_sliding_window", False))
    )
    return 0 if windowed else layers


def kv_bytes_per_token(config: Any, dtype: str) -> int | None:
    """Bytes of KV cache a token of one sequence takes in the engine, counting full-attention
    layers only (a lower bound of what vLLM reserves); None for an architecture outside
    :data:`PLAIN_ATTENTION` or a config that does not say its shape."""
    if str(getattr(config, "model_type", "")) not in PLAIN_ATTENTION:
        return None
    layers = _full_attention_layers(config)
    size = head_size(config)
    heads = getattr(config, "num_key_value_heads", None) or getattr(
        config, "num_attention_heads", None
    )
    if layers is None or size is None or not isinstance(heads, int) or heads <= 0:
        return None
    return 2 * layers * heads * size * DTYPE_BYTES.get(dtype, 4)


__all__ = ["DTYPE_BYTES", "PLAIN_ATTENTION", "kv_bytes_per_token"]
