"""LoRA adapters (``peft``, the optional ``harness[lora]`` extra) and gradient checkpointing.

What LoRA changes in the PPO loop, and why it needs no second model:

* only the adapter weights train (``peft`` freezes the base; the optimizer gets trainable
  parameters only);
* the KL reference is the base model itself, run with the adapters switched off
  (:func:`reference_off`), as TRL does: no frozen full copy;
* the staleness behaviour policy is the live model with an older *adapter* snapshot swapped in
  for the duration of sampling (:func:`swapped_in`): the ring holds adapter weights only.

Several runs can share one base model, each with its own named adapter (``peft``'s multi-adapter
model: :func:`add_adapter`, :func:`use_adapter`, :func:`delete_adapter`); the active adapter is
the only one that trains and the only one the forward adds, so a run sees exactly the model it
would have alone (``harness/run/packing.py``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from harness.model.build import build_model, build_tokenizer
from harness.model.options import LoraOptions, ModelOptions


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a ``peft`` model (adapters on a frozen base)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def apply_lora(model: Any, lora: LoraOptions) -> Any:
    """Wrap ``model`` with fresh LoRA adapters (B = 0: the wrapped model computes exactly what
    the base does until the first update). Raises ``ValueError`` (one line) when peft is
    missing or a target module does not exist."""
    try:
        import peft
    except ImportError:
        raise ValueError(
            "model_options.lora: needs the optional peft package (pip install -e '.[lora]')"
        ) from None
    targets: str | list[str] = (
        "all-linear" if lora.target_modules == ["all-linear"] else list(lora.target_modules)
    )
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        wrapped = peft.get_peft_model(model, config)
    except ValueError as err:
        msg = str(err).splitlines()[0] if str(err) else "invalid target_modules"
        raise ValueError(f"model_options.lora.target_modules: {msg}") from None
    return wrapped


# Module types peft 0.21's LoRA can adapt (``peft.tuners.lora.model``): anything else a target
# matches (a norm layer, a whole MLP block) makes get_peft_model raise mid-run.
def _adaptable_types() -> tuple[type, ...]:
    nn = torch.nn
    return (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention, Conv1D)


def check_target_modules(targets: list[str], modules: dict[str, torch.nn.Module]) -> None:
    """Raise ``ValueError`` (one line) unless every ``targets`` entry names at least one module
    of ``modules`` (name → module, as ``named_modules()``) and only modules LoRA can adapt.

    An entry matches a module as in peft: the full dotted name, or its last components
    (``q_proj`` matches ``model.layers.0.self_attn.q_proj``). peft itself accepts a list in
    which some entries match nothing (``[q_proj, qproj]`` silently adapts only q_proj) and
    fails with a traceback at load time for a norm layer; both are caught here, before a run."""
    if targets == ["all-linear"]:
        return
    adaptable = _adaptable_types()
    linear = sorted(
        {n.rsplit(".", 1)[-1] for n, m in modules.items() if n and isinstance(m, adaptable)}
    )
    hint = ", ".join(linear[:12]) + (", ..." if len(linear) > 12 else "")
    where = "model_options.lora.target_modules"
    for target in targets:
        hits = [(n, m) for n, m in modules.items() if n == target or n.endswith("." + target)]
        if not hits:
            raise ValueError(
                f"{where}: {target!r} matches no module of the model (adaptable layers here: "
                f"{hint}; or all-linear)"
            )
        bad = [(n, m) for n, m in hits if not isinstance(m, adaptable)]
        if bad:
            name, mod = bad[0]
            raise ValueError(
                f"{where}: {target!r} matches {type(mod).__name__} {name!r}, which LoRA cannot "
                f"adapt (adaptable layers here: {hint}; or all-linear)"
            )


def model_modules(
    spec: str, *, tiny: Any = None, trust_remote_code: bool = False
) -> dict[str, Any]:
    """Name → module of the model ``spec`` names, built from its config on the meta device: no
    weights are read or allocated (a 0.5B model's module tree in well under a second)."""
    with torch.device("meta"):
        if spec == "tiny":
            model = build_model(build_tokenizer(), tiny)
        else:
            config = AutoConfig.from_pretrained(
                spec, local_files_only=True, trust_remote_code=trust_remote_code
            )
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return dict(model.named_modules())


def prepare_for_training(model: Any, options: ModelOptions) -> Any:
    """Gradient checkpointing (non-reentrant: works with frozen inputs, e.g. under LoRA), then
    LoRA adapters when configured. Returns the model to train (a peft wrapper with LoRA)."""
    if options.gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(
                f"model_options.gradient_checkpointing: {type(model).__name__} does not support it"
            )
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if options.lora is not None:
        model = apply_lora(model, options.lora)
    return model


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached clones of the parameters that train (all of them, or the adapters under LoRA)."""
    with torch.no_grad():
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@contextlib.contextmanager
def swapped_in(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> Iterator[None]:
    """Temporarily load ``state`` (a :func:`trainable_state`) into ``model``; restore on exit."""
    params = dict(model.named_parameters())
    saved = {n: params[n].detach().clone() for n in state}
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t)
    try:
        yield
    finally:
        with torch.no_grad():
            for n, t in saved.items():
                params[n].copy_(t)


# peft's name of the adapter get_peft_model creates.
DEFAULT_ADAPTER = "default"


def renamed_adapter(state: dict[str, torch.Tensor], old: str, new: str) -> dict[str, torch.Tensor]:
    """``state`` (adapter weights, keys like ``...q_proj.lora_A.<old>.weight``) with the adapter
    name component ``old`` replaced by ``new``; nothing else in a key changes."""

    def rename(key: str) -> str:
        parts = key.split(".")
        for i in range(1, len(parts)):
            if parts[i] == old and parts[i - 1].startswith("lora_"):
                parts[i] = new
        return ".".join(parts)

    return {rename(k): t for k, t in state.items()}


def add_adapter(
    model: Any, name: str, state: dict[str, torch.Tensor], *, like: str = DEFAULT_ADAPTER
) -> None:
    """Add adapter ``name`` to the peft ``model`` with adapter ``like``'s LoRA config, holding
    ``state`` (a :func:`trainable_state` taken while ``like`` was active; its keys name ``like``).
    Every weight of the new adapter is set from ``state``; a key that names no parameter, or a
    weight ``state`` lacks, is an error. The active adapter stays what it was."""
    model.add_adapter(name, copy.deepcopy(model.peft_config[like]))
    params = dict(model.named_parameters())
    renamed = renamed_adapter(state, like, name)
    own = {n for n in params if f".{name}." in n and ".lora_" in n}
    if set(renamed) != own:
        missing = sorted(own - set(renamed))[:3] or sorted(set(renamed) - own)[:3]
        raise ValueError(f"adapter {name!r}: state does not match its weights ({missing})")
    with torch.no_grad():
        for n, t in renamed.items():
            params[n].copy_(t)


def use_adapter(model: Any, name: str) -> None:
    """Make ``name`` the adapter the forward adds and the one whose weights train (peft marks
    the other adapters' weights as not requiring gradients)."""
    model.set_adapter(name)


def delete_adapter(model: Any, name: str) -> None:
    """Remove adapter ``name`` and free its weights (another adapter must remain)."""
    model.delete_adapter(name)


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` (a :func:`trainable_state`) into ``model``'s parameters of the same names."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t)


def reference_off(model: Any) -> contextlib.AbstractContextManager[Any]:
    """The KL reference under LoRA: the same module with its adapters disabled."""
    return model.disable_adapter()  # type: ignore[no-any-return]


__all__ = [
    "DEFAULT_ADAPTER",
    "add_adapter",
    "apply_lora",
    "delete_adapter",
    "load_weights",
    "renamed_adapter",
    "use_adapter",
    "check_target_modules",
    "model_modules",
    "is_lora",
    "prepare_for_training",
    "reference_off",
    "swapped_in",
    "trainable_state",
]
