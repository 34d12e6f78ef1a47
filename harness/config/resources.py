"""Will the model fit? A parameter count from the config, compared with this machine's memory.

Why before anything runs: ``vocab_size: 1000000000`` in a ``config.json`` (or ``tiny.hidden_size:
65536`` on the command line) makes the first ``torch.empty`` ask for 128 GB or more; on a shared
machine that is an OOM kill or a swap storm minutes into a sweep, not a one-line config error.

The count comes from the config alone: the architecture is instantiated on the ``meta`` device
(shapes, no storage), so a 10^15-parameter config costs a few milliseconds. Only one and two
layers are built and the count is extrapolated linearly, so ``num_hidden_layers: 100000`` is as
cheap as 2 (and refused anyway: more than :data:`MAX_LAYERS` is a typo, not a model).

What a run holds, all float32 (:data:`BYTES_PER_PARAM`; bfloat16 is autocast, the weights stay
float32): the weights, their gradients and AdamW's two moments (:data:`FULL_FINETUNE_COPIES`)
under a full fine-tune, only the frozen weights under LoRA (adapters are small), plus one frozen
reference copy when ``ppo.kl_ctl > 0`` and, with ``rollout.staleness: k``, a behaviour copy and
``k + 1`` ring snapshots. Activations, the critic and the tokenizer are not counted: the
estimate is a lower bound, so what it refuses cannot fit, and a run it admits may still need more.

It is compared with the memory this machine can give: the smallest of the RAM available now
(psutil, else ``MemAvailable`` in ``/proc/meminfo``), the cgroup's limit less its usage, and the
address-space rlimit less this process's size; a CUDA machine also offers its largest GPU's free
memory (the weights still pass through RAM once while loading). ``HARNESS_MEMORY_CHECK=off``
skips the comparison (e.g. a Ray cluster whose workers have more memory than the machine that
validates), never the layer bound.
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from harness.model.build import build_tokenizer, tiny_llama_config
from harness.model.checkpoint import with_layers

if TYPE_CHECKING:
    from harness.config import RunConfig

MAX_LAYERS = 1024  # the same bound as tiny.num_layers: the deepest released LMs have ~200
BYTES_PER_PARAM = 4  # float32 master weights, whatever model_options.dtype autocasts to
FULL_FINETUNE_COPIES = 4  # weights + gradients + AdamW exp_avg + exp_avg_sq
GB = 1e9
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


def layer_count(config: Any) -> int | None:
    """``num_hidden_layers`` (HF aliases it as ``n_layer``, ``num_layers``, ...), if stated."""
    value = getattr(config, "num_hidden_layers", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _meta_count(config: Any, trust_remote_code: bool) -> int:
    with torch.device("meta"):
        if type(config) is LlamaConfig:
            model = LlamaForCausalLM(config)
        else:
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors counted once


# Counts by (config JSON, trust_remote_code): validation checks the same model once per grid
# value, and a meta instantiation is a few tens of milliseconds each time.
_COUNTS: dict[tuple[str, bool], int] = {}


def count_params(config: Any, *, trust_remote_code: bool = False) -> int:
    """Parameters of the causal LM ``config`` describes (meta device, layers extrapolated).

    Raises ``ValueError`` for more than :data:`MAX_LAYERS` layers."""
    layers = layer_count(config)
    if layers is not None and layers > MAX_LAYERS:
        raise ValueError(
            f"num_hidden_layers {layers} is more than the {MAX_LAYERS} layers the harness builds"
        )
    key = (
        type(config).__name__ + json.dumps(config.to_dict(), sort_keys=True, default=str),
        trust_remote_code,
    )
    if key not in _COUNTS:
        try:
            if layers is None or layers <= 2:
                _COUNTS[key] = _meta_count(config, trust_remote_code)
            else:  # layers are alike: count one and two, extrapolate (O(1) in the depth)
                one = _meta_count(with_layers(config, 1), trust_remote_code)
                two = _meta_count(with_layers(config, 2), trust_remote_code)
                _COUNTS[key] = one + (layers - 1) * (two - one)
        except Exception as err:  # the config cannot make a model: loading it would fail too
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise ValueError(
                f"cannot build a causal LM from this config ({type(err).__name__}: {first})"[:400]
            ) from None
    return _COUNTS[key]


def _meminfo_available() -> tuple[int, str] | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available), "RAM available"
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "RAM available"
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2) = no limit


def _cgroup_available() -> tuple[int, str] | None:
    """The memory cgroup's limit less its usage (v2, else v1), None without a limit."""
    root = Path("/sys/fs/cgroup")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    candidates: list[tuple[Path, Path]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2 unified hierarchy
            base = root / rel.lstrip("/")
            candidates += [(base / "memory.max", base / "memory.current")]
        elif "memory" in controllers.split(","):
            base = root / "memory" / rel.lstrip("/")
            candidates += [(base / "memory.limit_in_bytes", base / "memory.usage_in_bytes")]
    candidates += [
        (root / "memory.max", root / "memory.current"),
        (root / "memory" / "memory.limit_in_bytes", root / "memory" / "memory.usage_in_bytes"),
    ]
    for limit_file, usage_file in candidates:
        limit = _read_int(limit_file)
        if limit is not None and limit < 1 << 60:  # v1 writes ~2**63 for "no limit"
            usage = _read_int(usage_file) or 0
            return max(0, limit - usage), "memory cgroup limit left"
    return None


def _rlimit_available() -> tuple[int, str] | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                used = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return max(0, soft - used), "address-space limit (ulimit -v) left"


def available_memory() -> tuple[int | None, str]:
    """(bytes this process can still allocate, what bounds it); None when nothing is known."""
    found = [x for x in (_meminfo_available(), _cgroup_available(), _rlimit_available()) if x]
    if not found:
        return None, "unknown"
    return min(found)


def _largest_gpu_free() -> int | None:
    try:
        if not torch.cuda.is_available():
            return None
        return max(int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count()))
    except Exception:  # a broken driver: fall back to RAM alone
        return None


def training_copies(cfg: RunConfig) -> tuple[int, str]:
    """How many float32 copies of the weights a run holds (a lower bound; module docstring)."""
    lora = cfg.model_options.lora is not None
    copies, parts = (
        (1, ["weights (LoRA)"]) if lora else (FULL_FINETUNE_COPIES, ["weights+grads+AdamW"])
    )
    if not lora and cfg.ppo.kl_ctl > 0:
        copies += 1
        parts.append("reference")
    if not lora and cfg.rollout.staleness:
        copies += cfg.rollout.staleness + 2
        parts.append(f"{cfg.rollout.staleness + 2} staleness snapshots")
    return copies, " + ".join(parts)


def tiny_model_config(cfg: RunConfig) -> Any:
    return tiny_llama_config(build_tokenizer(), cfg.tiny)


def check_weights(model_dir: str) -> None:
    """A model directory must hold weights ``from_pretrained`` can load (else a mid-run OSError)."""
    root = Path(model_dir)
    if not any(next(root.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise ValueError(
            f"model: directory {model_dir!r} has no weights (expected model.safetensors, "
            "model-*.safetensors or pytorch_model.bin)"
        )


def memory_check_off() -> bool:
    """``HARNESS_MEMORY_CHECK=off``: skip comparing what a run needs with this machine's memory."""
    return os.environ.get("HARNESS_MEMORY_CHECK", "").strip().lower() in ("off", "0", "false", "no")


def _gb(n: float) -> str:
    return f"{n / GB:,.1f} GB" if n >= GB / 10 else f"{n / 1e6:,.1f} MB"


def check_model_memory(cfg: RunConfig, config: Any | None = None) -> int:
    """Raise ``ValueError`` (one line) when ``cfg``'s model cannot fit; returns its parameters.

    ``config`` is the model's HF config (read from the directory); None for the tiny model."""
    if cfg.model == "tiny":
        t = cfg.tiny
        where = (
            f"tiny (hidden_size {t.hidden_size}, num_layers {t.num_layers}, "
            f"intermediate_size {t.intermediate_size})"
        )
    else:
        shape = ", ".join(
            f"{k} {getattr(config, k)}"
            for k in ("vocab_size", "hidden_size", "num_hidden_layers")
            if isinstance(getattr(config, k, None), int)
        )
        where = f"model {cfg.model!r}" + (f" (config.json: {shape})" if shape else "")
    trust = cfg.model_options.trust_remote_code
    try:
        params = count_params(config or tiny_model_config(cfg), trust_remote_code=trust)
    except ValueError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{where}: {first}") from None
    if memory_check_off():
        return params
    copies, parts = training_copies(cfg)
    need = params * BYTES_PER_PARAM * copies
    ram, bound = available_memory()
    # GPUs are asked only when RAM is not enough: querying one creates a CUDA context, which the
    # sweep coordinator would otherwise hold (hundreds of MB of GPU memory) for nothing.
    gpu = _largest_gpu_free() if ram is not None and need > ram else None
    room = max(ram or 0, gpu or 0) if ram is not None else None
    what = f"{params:,} parameters x {BYTES_PER_PARAM} bytes x {copies} ({parts})"
    if room is not None and need > room:
        where_room = f"{_gb(ram or 0)} {bound}" + (
            f", {_gb(gpu)} free on the largest GPU" if gpu else ""
        )
        raise ValueError(
            f"{where}: needs at least {_gb(need)} ({what}) but this machine has {where_room}; "
            "use a smaller model, model_options.lora, or set HARNESS_MEMORY_CHECK=off to skip"
        )
    load = params * BYTES_PER_PARAM
    if ram is not None and load > ram:  # from_pretrained materialises float32 weights in RAM
        raise ValueError(
            f"{where}: loading needs at least {_gb(load)} of RAM ({params:,} float32 parameters) "
            f"but this machine has {_gb(ram)} {bound}"
        )
    return params


__all__ = [
    "BYTES_PER_PARAM",
    "FULL_FINETUNE_COPIES",
    "MAX_LAYERS",
    "available_memory",
    "check_model_memory",
    "check_weights",
    "count_params",
    "layer_count",
    "memory_check_off",
    "training_copies",
]
