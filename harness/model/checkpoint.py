"""What a model directory's files say about the model, read without loading a tensor: its
position limit, the architecture its ``config.json`` declares, and the names of the tensors its
checkpoint holds (the safetensors header or the index, never the data).

Why: each of these, when wrong, failed late or not at all.  ``architectures:
[MambaForCausalLM]`` over Llama weights trained a Llama locally (transformers builds the class
from ``model_type``) but failed 45 s into an engine start (vLLM builds it from
``architectures``); ``model_type: mamba`` as well trained a randomly initialised Mamba without
an error (transformers initialises the tensors a checkpoint lacks and loads on).  A negative
``max_position_embeddings`` failed at the engine's start with an unrelated first line, and
``10**12`` made the engine's start allocate terabytes for its rotary table (vLLM sizes it by
that field, whatever the run needs).
"""

from __future__ import annotations

import copy
import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import torch

from harness.core.limits import read_bounded_text
from harness.model.build import POSITION_KEYS

# The longest context a released model states is 10,485,760 positions (Llama 4 Scout); a value
# past 2**24 is a typo, and the engine allocates by it (module docstring).
MAX_POSITIONS = 1 << 24
# safetensors' own bound on a header (its MAX_HEADER_SIZE); real ones are a few hundred KB.
MAX_HEADER_BYTES = 100_000_000
# A sharded checkpoint's index (the largest released ones, ~100k tensors, are ~10 MB).
MAX_INDEX_BYTES = 64 * 1024 * 1024
# A checkpoint missing more than this share of the tensors the model expects holds another
# architecture's weights.  Not zero: transformers renames some checkpoint keys when it loads
# (fused MoE experts, legacy norm names), which a name comparison cannot follow, and those are
# a minority of a layer's tensors.
MAX_MISSING_SHARE = 0.5


def position_problem(config: Any) -> str | None:
    """Why the position limit ``config`` states cannot be right (None when it can): a value
    that is not a positive integer, or one past :data:`MAX_POSITIONS`."""
    stated = vars(config)
    for key in POSITION_KEYS:
        value = stated.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return (
                f"config.json {key} {value!r} must be a positive integer (the longest sequence "
                "the model takes)"
            )
        if value > MAX_POSITIONS:
            return (
                f"config.json {key} {value:,} is more than {MAX_POSITIONS:,} positions, past "
                "any released model's (the longest states 10,485,760); the inference engine "
                "sizes its rotary table by it; state the model's real limit"
            )
    return None


@cache
def _model_types_by_class() -> dict[str, frozenset[str]]:
    """Each model class transformers' auto mappings name → the ``model_type``s it serves."""
    from transformers.models.auto import modeling_auto  # noqa: PLC0415 - transformers' tables: only when a directory is checked

    found: dict[str, set[str]] = {}
    for name in dir(modeling_auto):
        if not (name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES")):
            continue
        for model_type, classes in getattr(modeling_auto, name).items():
            for cls in classes if isinstance(classes, (list, tuple)) else (classes,):
                found.setdefault(cls, set()).add(model_type)
    return {cls: frozenset(types) for cls, types in found.items()}


def declared_architecture_problem(config: Any) -> str | None:
    """Why ``config``'s ``architectures`` contradict its ``model_type`` (None when they agree
    or transformers does not know the class): transformers builds the model from
    ``model_type`` and the inference engine from ``architectures``, so the two would train and
    sample different models (or the engine fails to load the weights)."""
    names = getattr(config, "architectures", None) or []
    custom = set(str(v) for v in (getattr(config, "auto_map", None) or {}).values())
    model_type = str(getattr(config, "model_type", ""))
    known = _model_types_by_class()
    for arch in names if isinstance(names, list) else [names]:
        types = known.get(arch) if isinstance(arch, str) else None
        if types is None or model_type in types or any(arch in v for v in custom):
            continue
        kind = " or ".join(sorted(types))
        return (
            f"config.json names architecture {arch}, a {kind} model, but its model_type is "
            f"{model_type or '(none)'} (transformers builds the model from model_type, the "
            "inference engine from architectures); make them agree with the weights"
        )
    return None


def _safetensors_names(path: Path) -> set[str]:
    """The tensor names in a safetensors file's header (8-byte little-endian length, then
    that many bytes of JSON), read without touching the data."""
    bad = f"model: {path}: not a safetensors file"
    with path.open("rb") as fh:
        head = fh.read(8)
        size = os.fstat(fh.fileno()).st_size
        if len(head) < 8:
            raise ValueError(f"{bad} (shorter than its 8-byte header length)")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise ValueError(f"{bad} (a header of {n:,} bytes in a file of {size:,})")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both
        raise ValueError(f"{bad} (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{bad} (its header is not a JSON object)")
    return {str(k) for k in header if k != "__metadata__"}


def _index_names(path: Path) -> set[str]:
    try:
        data = json.loads(read_bounded_text(path, MAX_INDEX_BYTES, "a checkpoint index"))
    except ValueError as err:
        first = str(err).splitlines()[0] if str(err) else "not JSON"
        raise ValueError(f"model: {path}: {first}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"model: {path}: has no weight_map mapping tensor names to files")
    return {str(k) for k in weight_map}


# The files transformers loads weights from, in its order; a lone pytorch_model.bin is not read
# (its names are in a pickle: reading them means unpickling).
_SOURCES = (
    ("model.safetensors", _safetensors_names),
    ("model.safetensors.index.json", _index_names),
    ("pytorch_model.bin.index.json", _index_names),
)
_NAMES: dict[tuple[str, int, int], set[str]] = {}


def checkpoint_names(model_dir: str | Path) -> tuple[set[str], Path] | None:
    """(tensor names, the file they were read from) of the checkpoint in ``model_dir``, or None
    when only a pickled ``pytorch_model.bin`` holds them.  Raises ``ValueError`` (one line) for
    a header or index that cannot be read."""
    for name, read in _SOURCES:
        path = Path(model_dir) / name
        try:
            st = path.stat()
        except OSError:
            continue
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
        if key not in _NAMES:  # validation reads a directory once per grid value
            _NAMES[key] = read(path)
        return _NAMES[key], path
    return None


# By (config class, config JSON, trust_remote_code): validation checks the same model once per
# grid value, and a meta instantiation costs tens of milliseconds.
_EXPECTED: dict[tuple[str, str, bool], tuple[str, str, frozenset[str]] | None] = {}


def _expected_names(config: Any, trust_remote_code: bool) -> tuple[str, str, frozenset[str]] | None:
    """(class name, base-model prefix, parameter names) of the causal LM transformers builds
    for ``config``, with one layer, on the meta device (no storage); None when it cannot be
    built (the memory check reports that, with its reason)."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - transformers: only when a directory is checked

    key = (
        type(config).__name__,
        json.dumps(config.to_dict(), sort_keys=True, default=str),
        trust_remote_code,
    )
    if key in _EXPECTED:
        return _EXPECTED[key]
    if isinstance(getattr(config, "num_hidden_layers", None), int):
        config = with_layers(config, 1)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except Exception:  # an unbuildable config is the memory check's to report
        _EXPECTED[key] = None
        return None
    names = {n for n, _ in model.named_parameters()}
    tied = getattr(model, "_tied_weights_keys", None) or {}
    names -= set(tied)  # a tied output embedding may be absent: it is the input one
    for pattern in getattr(model, "_keys_to_ignore_on_load_missing", None) or []:
        names = {n for n in names if re.search(pattern, n) is None}
    _EXPECTED[key] = (type(model).__name__, str(model.base_model_prefix or ""), frozenset(names))
    return _EXPECTED[key]


def with_layers(config: Any, n: int) -> Any:
    """A copy of ``config`` with ``n`` layers (its per-layer lists cut to match)."""
    out = copy.deepcopy(config)
    out.num_hidden_layers = n
    for name in ("layer_types", "sliding_window_pattern_list"):  # per-layer lists, if any
        value = getattr(out, name, None)
        if isinstance(value, list) and len(value) > n:
            setattr(out, name, value[:n])
    return out


def _strip(name: str, prefix: str) -> str:
    """A tensor name without the base model's prefix: a checkpoint saved from the base model
    lacks it, and transformers adds it when loading."""
    return name[len(prefix) + 1 :] if prefix and name.startswith(prefix + ".") else name


def weights_problem(model_dir: str, config: Any, *, trust_remote_code: bool = False) -> str | None:
    """Why the checkpoint in ``model_dir`` does not hold the weights of the model ``config``
    builds (None when it does, or when that cannot be told without loading tensors): most of
    the tensors the model's first layer and ends expect are missing.  Raises ``ValueError``
    for a checkpoint header or index that cannot be read."""
    if getattr(config, "quantization_config", None) is not None:
        return None  # quantized layers hold other tensors (qweight, scales, ...)
    found = checkpoint_names(model_dir)
    if found is None:
        return None
    names, source = found
    built = _expected_names(config, trust_remote_code)
    if built is None:
        return None
    cls, prefix, expected = built
    have = {_strip(n, prefix) for n in names}
    missing = sorted(n for n in expected if _strip(n, prefix) not in have)
    if not expected or len(missing) <= MAX_MISSING_SHARE * len(expected):
        return None
    sample = min((n for n in names if ".0." in n), default=min(names, default=None))
    has = f"the checkpoint has e.g. {sample}" if sample else "the checkpoint holds no tensors"
    return (
        f"{source} does not hold the weights of {cls} (config.json model_type "
        f"{getattr(config, 'model_type', '')}): {len(missing)} of the {len(expected)} tensors "
        f"checked (the first layer's and those outside the layers) are missing, e.g. "
        f"{missing[0]}; {has}; make config.json's model_type and architectures match the weights"
    )


__all__ = [
    "MAX_POSITIONS",
    "checkpoint_names",
    "declared_architecture_problem",
    "position_problem",
    "weights_problem",
    "with_layers",
]
