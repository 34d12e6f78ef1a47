"""What a run says about its model: the tiny model's shape, LoRA, precision and loading options.

Plain dataclasses with a help string and bounds per field, importable without torch, so that
parsing a run config (``--dry-run``, ``harness fields``) never loads torch or transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.core.fields import option


@dataclass
class TinyModelConfig:
    """Shape of the tiny Llama policy (defaults: ~0.4M parameters, fast on one CPU core)."""

    # Bounds (ge/le) are checked by harness.core.configtools when a config is built from YAML.
    hidden_size: int = option(128, "Width of the residual stream.", ge=1, le=65_536)
    num_layers: int = option(2, "Number of transformer blocks.", ge=1, le=1024)
    num_heads: int = option(
        4, "Attention heads per block (must divide hidden_size).", ge=1, le=1024
    )
    intermediate_size: int = option(
        256, "Hidden width of each block's SwiGLU MLP.", ge=1, le=262_144
    )
    max_position_embeddings: int = option(
        512, "Longest prompt + completion the RoPE tables cover.", ge=1, le=1_048_576
    )

    def __post_init__(self) -> None:
        # The declared bounds are checked before construction; only the fields' agreement is left.
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"tiny.hidden_size ({self.hidden_size}) must be divisible by tiny.num_heads "
                f"({self.num_heads})"
            )


@dataclass
class LoraOptions:
    """LoRA adapters through ``peft`` (the optional ``harness[lora]`` extra)."""

    r: int = option(8, "Adapter rank.", ge=1, le=65_536)
    alpha: int = option(16, "LoRA scaling numerator (scale = alpha / r).", ge=1, le=1_000_000)
    dropout: float = option(
        0.0,
        "Dropout on the adapter input, live in the update's forward only (sampling, "
        "recompute and reference run without it); keep 0 for ratio = 1 on fresh data.",
        ge=0,
        lt=1,
    )
    target_modules: list[str] = option(
        help="Module names to adapt, e.g. [q_proj, v_proj]; [all-linear] = every "
        "linear layer except the output head.",
        factory=lambda: ["all-linear"],
    )

    def __post_init__(self) -> None:
        # r, alpha and dropout are checked from their declarations; a list length is not declarable.
        if not self.target_modules or not all(
            isinstance(t, str) and t for t in self.target_modules
        ):
            raise ValueError("lora.target_modules must be a non-empty list of module names")


@dataclass
class ModelOptions:
    """How the policy is loaded and run (any model spec; some options only matter for HF dirs).

    Precision: ``bfloat16`` runs every forward (sampler, recompute, reference, update, critic)
    under ``torch.autocast(bfloat16)`` on the model's device, CPU included, while the weights
    and AdamW state stay float32 (the master copy). Why autocast rather than bf16 weights: the
    same context wraps all passes, so sampled and recomputed log-probs come from the same
    bf16 matmuls, and small Adam updates are not lost to bf16 rounding of the weights.
    """

    dtype: Literal["float32", "bfloat16"] = option(
        "float32",
        "Compute precision of every forward pass: float32, or bfloat16 autocast "
        "with float32 master weights (CPU and CUDA).",
    )
    attn_implementation: Literal["sdpa", "eager"] = option(
        "sdpa",
        "Attention kernel of a loaded HF model (sdpa falls back to eager, with a "
        "warning, for architectures without an SDPA kernel, e.g. Gemma2).",
    )
    trust_remote_code: bool = option(
        False,
        "Run Python code shipped in the model directory (false by default: "
        "a directory with custom modeling code is refused unless you set this).",
    )
    gradient_checkpointing: bool = option(
        False, "Recompute activations in the backward pass (less memory, ~30% slower)."
    )
    lora: LoraOptions | None = option(
        None, "LoRA adapters {r, alpha, dropout, target_modules}; null = full fine-tune."
    )
