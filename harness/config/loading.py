"""Reading run configs: YAML (duplicate keys and oversized expansions refused), ``--set``
overrides, the short aliases, and the one-line error that names where a problem comes from.

defaults < file < ``--set``: ``build_run_config`` merges and validates once, ``load_run_config``
adds the file, the task check and the blame (which flag or file brought the problem in).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import yaml

from harness.config.asynchrony import ASYNC_ALIAS, ASYNC_PATH
from harness.config.schema import RunConfig
from harness.config.trainer_checks import check_trainer
from harness.core import limits
from harness.core.configtools import ConfigError, from_dict, parse_override, set_path
from harness.ppo.corrections import PRESETS
from harness.ppo.corrections.registry import preset_block
from harness.tasks import get_task

# Short names accepted for --set and experiment axes.
ALIASES = {"adv_norm": "ppo.adv_norm", "reward_norm": "ppo.reward_norm"}


def resolve_alias(path: str) -> str:
    head, _, rest = path.partition(".")
    if head in ALIASES:
        return ALIASES[head] + ("." + rest if rest else "")
    if path == ASYNC_ALIAS or path.startswith(ASYNC_ALIAS + "."):
        return ASYNC_PATH + path[len(ASYNC_ALIAS) :]
    return path


def fold_async_block(data: dict[str, Any]) -> dict[str, Any]:
    """``rollout.async`` → ``rollout.asynchronous`` (in a deep copy; ``async`` is a Python
    keyword, so the field has the longer name); given both ways, ``async``'s keys win."""
    out = copy.deepcopy(data)
    rollout = out.get("rollout")
    if not isinstance(rollout, dict) or "async" not in rollout:
        return out
    block = rollout.pop("async")
    have = rollout.get("asynchronous")
    if isinstance(block, dict) and isinstance(have, dict):
        block = {**have, **block}
    rollout["asynchronous"] = block
    return out


# ``rollout.sampler``: the sampler as one block, its backend and that backend's options
# (harness/sampling/: ``local`` with its ``decoder``, ``vllm`` with its memory settings).  Each
# key is folded into the flat ``rollout`` field it stands for (those keep working as they are, in
# files, ``--set`` and grid axes); given both ways, the block's value wins.
SAMPLER_BLOCK = "rollout.sampler"
SAMPLER_KEYS: dict[str, str] = {
    "backend": "rollout.sampler_backend",
    "decoder": "rollout.sampler_backend",
    "dtype": "rollout.sampler_dtype",
    "logit_noise": "rollout.sampler_logit_noise",
    "kv_cache_gib": "rollout.engine_kv_cache_gib",
    "gpu_memory_utilization": "rollout.engine_gpu_memory_utilization",
}
# The keys only one backend reads: given with the other, a setting that would do nothing.
_BACKEND_ONLY = {
    "decoder": "local",
    "logit_noise": "local",
    "kv_cache_gib": "vllm",
    "gpu_memory_utilization": "vllm",
}
SAMPLER_BACKENDS = ("local", "vllm")
DECODERS = ("auto", "fast", "hf")


def is_sampler_path(path: str) -> bool:
    """Whether ``path`` is ``rollout.sampler`` or one of its keys."""
    return path == SAMPLER_BLOCK or (
        path.startswith(SAMPLER_BLOCK + ".") and path[len(SAMPLER_BLOCK) + 1 :] in SAMPLER_KEYS
    )


def fold_sampler_block(data: dict[str, Any]) -> dict[str, Any]:
    """``rollout.sampler`` (a block, or a backend's name) → the flat ``rollout`` fields it
    stands for (in a deep copy; module comment at :data:`SAMPLER_KEYS`)."""
    out = copy.deepcopy(data)
    rollout = out.get("rollout")
    if not isinstance(rollout, dict) or "sampler" not in rollout:
        return out
    block = rollout.pop("sampler")
    if isinstance(block, str):
        block = {"backend": block}
    if not isinstance(block, dict):
        raise ConfigError(
            f"{SAMPLER_BLOCK}: must be a backend name or a mapping (backend and its options); "
            f"got {block!r}"
        )
    unknown = sorted(set(block) - set(SAMPLER_KEYS))
    if unknown:
        raise ConfigError(
            f"{SAMPLER_BLOCK}.{unknown[0]}: unknown key (allowed: {', '.join(SAMPLER_KEYS)})"
        )
    flat_backend = rollout.get("sampler_backend", "auto")
    backend = block.get("backend", "vllm" if flat_backend == "vllm" else "local")
    if backend not in SAMPLER_BACKENDS:
        raise ConfigError(
            f"{SAMPLER_BLOCK}.backend: must be one of {', '.join(SAMPLER_BACKENDS)}; got {backend!r}"
        )
    for key, owner in _BACKEND_ONLY.items():
        if key in block and owner != backend:
            raise ConfigError(
                f"{SAMPLER_BLOCK}.{key}: an option of backend {owner}, not of {backend}"
            )
    decoder: Any = "vllm"
    if backend != "vllm":
        decoder = block.get("decoder", flat_backend if flat_backend != "vllm" else "auto")
        if decoder not in DECODERS:
            raise ConfigError(
                f"{SAMPLER_BLOCK}.decoder: must be one of {', '.join(DECODERS)}; got {decoder!r}"
            )
    rollout["sampler_backend"] = decoder
    for key, value in block.items():
        if key not in ("backend", "decoder"):
            rollout[SAMPLER_KEYS[key].split(".", 1)[1]] = value
    return out


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last
    one silently, so ``steps:`` written twice would quietly change a run)."""


def _no_duplicate_keys(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
        try:
            hash(key)
        except TypeError:
            continue  # the base constructor reports unhashable keys itself
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first on line {seen[key] + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _no_duplicate_keys,  # type: ignore[arg-type]
)


MAX_YAML_VALUES = 100_000


def parse_yaml_text(text: str) -> Any:
    """YAML (safe subset) with duplicate keys refused; raises ``yaml.YAMLError``.

    Aliases share objects, so a few lines can stand for billions of values ("billion laughs");
    the expanded size is bounded before anything copies, hashes or walks the data."""
    data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    stack, seen = [data], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > MAX_YAML_VALUES:
            raise yaml.YAMLError(f"expands to more than {MAX_YAML_VALUES} values (nested aliases?)")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return data


def load_yaml(path: str | Path) -> dict[str, Any]:

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: file not found")
    try:  # bounded before parsing: PyYAML takes minutes over hundreds of MB
        text = limits.read_bounded_text(
            p, limits.MAX_YAML_BYTES, "a run or experiment file", shown=path
        )
    except limits.NotUtf8 as err:
        raise ConfigError(f"{err}; expected a YAML file") from None
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if "\x00" in text:
        raise ConfigError(f"{path}: holds NUL bytes (a binary file?); expected a YAML file")
    try:
        data = parse_yaml_text(text) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"{path}:{where} is not valid YAML ({getattr(err, 'problem', err)})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a mapping of config keys")
    return data


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys (aliases resolved) in a deep copy of a plain config dict; ``data`` and
    ``overrides`` are never modified.

    Shallower paths are set first (a stable sort by depth): a key and a key inside it
    (``ppo.correction: seq_tis`` from a variant, ``ppo.correction.clip_max: 3`` from an axis or a
    later ``--set``) always mean "this block, with this key changed", whatever order the axes or
    flags came in.  Set the other way round the block would replace the inner key, and the cell
    labelled ``clip_max=3`` would silently train with the preset's 2."""
    out = copy.deepcopy(data)
    resolved = sorted(
        ((resolve_alias(key), value) for key, value in overrides.items()),
        key=lambda kv: kv[0].count("."),
    )
    for full, value in resolved:
        _refine_preset(out, full)
        set_path(out, full, copy.deepcopy(value))
    return out


# Config paths whose value may be a preset name standing for a whole block.
PRESET_PATHS = ("ppo.correction",)


def _refine_preset(data: dict[str, Any], dotted: str) -> None:
    """Before a sub-key of a preset path is set (``ppo.correction.clip_max`` after
    ``ppo.correction: token_tis``), the name becomes ``{preset: token_tis}``, so the sub-key
    refines the preset instead of replacing it by a block holding only that key."""
    for block in PRESET_PATHS:
        if not dotted.startswith(block + "."):
            continue
        *parents, last = block.split(".")
        cur: Any = data
        for p in parents:
            cur = cur.get(p) if isinstance(cur, dict) else None
        if isinstance(cur, dict) and isinstance(cur.get(last), str):
            cur[last] = {"preset": cur[last]}


def expand_presets(data: dict[str, Any]) -> dict[str, Any]:
    """A block naming a preset (``{preset: token_tis, clip_max: 3}``) → the preset's block with
    the given keys overriding its own (in a deep copy)."""
    out = copy.deepcopy(data)
    ppo = out.get("ppo")
    if not isinstance(ppo, dict):
        return out
    block = ppo.get("correction")
    if isinstance(block, dict) and "preset" in block:
        name = block.pop("preset")
        if name not in PRESETS:
            raise ConfigError(
                f"ppo.correction.preset: must be one of {', '.join(PRESETS)}; got {name!r}"
            )
        ppo["correction"] = {**preset_block(name), **block}
    return out


def expand_aliases(data: dict[str, Any]) -> dict[str, Any]:
    """Top-level ``adv_norm:``/``reward_norm:`` blocks move under ``ppo``, and
    ``rollout.async`` becomes ``rollout.asynchronous`` (in a deep copy)."""
    out = fold_async_block(data)
    for short, full in ALIASES.items():
        if short in out:
            value = out.pop(short)
            set_path(out, full, value)
    return out


def build_run_config(
    data: dict[str, Any] | None = None, overrides: list[str] | dict[str, Any] | None = None
) -> RunConfig:
    """defaults < data < overrides → validated RunConfig (raises ConfigError), checked against
    the trainer it names (``harness.config.trainer_checks``)."""
    merged = expand_aliases(data or {})
    if isinstance(overrides, list):
        overrides = dict(parse_override(o) for o in overrides)
    merged = fold_sampler_block(expand_presets(apply_overrides(merged, overrides or {})))
    # A config's warning says a setting will not do what it reads as: never silenced, it is
    # the one-line error instead (the CLI's exit 2), found before anything runs.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = from_dict(RunConfig, merged)
        check_trainer(cfg)  # what the trainer it names cannot express (trainer_checks)
    for w in caught:
        if issubclass(w.category, UserWarning):
            raise ConfigError(str(w.message).splitlines()[0])
    for w in caught:  # a library's own warning (deprecations ...) is shown as it would be
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return cfg


def validate_task(cfg: RunConfig) -> None:
    """Resolve the task spec now, so a bad task fails before anything runs or is written."""
    try:
        task = get_task(cfg.task, **cfg.task_options)
    except (ValueError, TypeError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(msg if msg.startswith("task") else f"task: {msg}") from None
    from harness.config.preflight import check_lengths  # noqa: PLC0415 - loads transformers: only when a task is validated

    try:
        check_lengths(cfg, task)
        lora = cfg.model_options.lora
        if lora is not None:  # peft is installed: check_lengths says so otherwise
            from harness.model.lora import check_target_modules, model_modules  # noqa: PLC0415 - loads transformers: only when a task is validated

            modules = model_modules(
                cfg.model, tiny=cfg.tiny, trust_remote_code=cfg.model_options.trust_remote_code
            )
            check_target_modules(lora.target_modules, modules)
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None


def load_run_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """File < ``--set`` overrides → validated RunConfig.

    The merged result is validated once: flags that are only valid together (``trainer=trl``
    with the ``reward_norm`` it needs, ``c_clip=null`` with ``policy_loss=cispo``) are accepted
    together.  A problem names where it comes from: the ``--set`` flag whose key the message
    names, else the file or the first flag that brings the problem in (see ``_blame``)."""
    data = load_yaml(path) if path is not None else {}
    parsed = [(text, parse_override(text)) for text in overrides or []]
    try:
        cfg = build_run_config(data, dict(kv for _, kv in parsed))
    except ConfigError as err:
        raise ConfigError(_blame(str(err), path, data, parsed)) from None
    try:
        validate_task(cfg)  # the task, the model's files and lengths: messages name the field
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}" if path and not parsed else str(err)) from None
    return cfg


def _error_key(message: str) -> str:
    """The dotted config path a validation message starts with ('ppo.c_clip: ...',
    'ppo.adv_norm.group_size 3 must ...', "task 'x': ..." → 'task'), list indices dropped."""
    head = message.split(":", 1)[0].split(" ", 1)[0]
    return head.split("[", 1)[0]


def _related(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _blame(
    message: str,
    path: str | Path | None,
    data: dict[str, Any],
    parsed: list[tuple[str, tuple[str, Any]]],
) -> str:
    """Attach a source to a validation message of the merged config (only called on failure).

    1. the last ``--set`` flag whose key is, contains or lies inside the key the message names;
    2. else the file, if it fails alone with a message about the same key;
    3. else the first flag that, added in command-line order, brings in that key's problem;
    4. else the message as it is (a problem of the flags together)."""
    key = _error_key(message)
    for text, (flag_key, _) in reversed(parsed):
        if _related(resolve_alias(flag_key), key):
            return f"--set {text}: {_strip_path(message, resolve_alias(flag_key))}"
    prefix: dict[str, Any] = {}
    for i in range(len(parsed) + 1):
        if i:
            prefix[parsed[i - 1][1][0]] = parsed[i - 1][1][1]
        try:
            build_run_config(data, prefix)
        except ConfigError as err:
            if _error_key(str(err)) == key:  # the merged config's own message, with its source
                if i == 0:
                    return f"{path}: {message}" if path is not None else message
                return f"--set {parsed[i - 1][0]}: {message}"
    return f"--set: {message}" if parsed else message


def _strip_path(message: str, key: str) -> str:
    """'ppo.eps_clip: must be > 0' → 'must be > 0' when the flag already names ppo.eps_clip."""
    return message[len(key) + 2 :] if message.startswith(key + ": ") else message
