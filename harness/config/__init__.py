"""The run configuration: one typed dataclass tree, validated once (defaults < file < --set).

``PPOActorConfig`` uses AReaL's field names; ``RunConfig`` wraps it with the model, task,
rollout, optimizer, critic, warm start, evaluation and device settings of one PPO training run.
The same ``RunConfig`` is what an ablation cell overrides.
"""

from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from harness.core.configtools import (
    ConfigError,
    from_dict,
    is_device_name,
    meta,
    parse_override,
    set_path,
)
from harness.model.options import ModelOptions, TinyModelConfig
from harness.ppo.config import PPOActorConfig, PPOConfig

# Field metadata: help text plus the declared range (see harness.core.configtools.meta); every numeric
# field is range- and finiteness-checked from these declarations when a config is built.
_h = meta
BIG = 10_000_000  # upper bound of step-like counts: far beyond any CPU/GPU run, far below overflow


@dataclass
class RolloutConfig:
    prompts_per_step: int = field(
        default=8, metadata=_h("Prompts sampled per training step.", ge=1, le=100_000)
    )
    n_samples: int = field(
        default=4, metadata=_h("Completions per prompt (the group).", ge=1, le=10_000)
    )
    max_new_tokens: int = field(default=12, metadata=_h("Longest completion.", ge=1, le=100_000))
    top_p: float = field(
        default=1.0, metadata=_h("Nucleus sampling threshold (1 = off).", gt=0, le=1)
    )
    staleness: int = field(
        default=0,
        metadata=_h(
            "Sample with the policy as it was k updates ago (emulates async RL).", ge=0, le=10_000
        ),
    )
    chat_template: str = field(
        default="none",
        metadata=_h(
            "none = prompts as is; auto = the tokenizer's chat template when it has one (one "
            "user turn + generation prompt); or a path to a Jinja template file (~ expanded; "
            "relative to the current directory)."
        ),
    )
    max_prompt_tokens: int | None = field(
        default=None,
        metadata=_h(
            "Keep only the last N tokens of longer prompts (null = never truncate; a prompt "
            "+ max_new_tokens past the model's positions is then a config error).",
            ge=1,
            le=1_048_576,
        ),
    )

    def __post_init__(self) -> None:
        if self.chat_template not in ("auto", "none"):
            self.chat_template = os.path.expanduser(self.chat_template)
        if self.chat_template not in ("auto", "none") and not Path(self.chat_template).is_file():
            raise ValueError(
                f"chat_template: file {self.chat_template!r} not found (use auto, none or a path)"
            )


@dataclass
class OptimConfig:
    lr: float = field(default=3e-4, metadata=_h("AdamW learning rate of the policy.", gt=0))
    weight_decay: float = field(default=0.0, metadata=_h("AdamW weight decay.", ge=0))
    beta1: float = field(default=0.9, metadata=_h("AdamW β1.", ge=0, lt=1))
    beta2: float = field(default=0.999, metadata=_h("AdamW β2.", ge=0, lt=1))
    schedule: Literal["constant", "linear", "cosine"] = field(
        default="constant", metadata=_h("Learning-rate schedule over the run.")
    )
    warmup_steps: int = field(
        default=0, metadata=_h("Linear warm-up, in optimizer steps.", ge=0, le=BIG)
    )
    grad_clip: float | None = field(
        default=1.0, metadata=_h("Clip the gradient norm to this (null = no clipping).", gt=0)
    )


@dataclass
class CriticConfig:
    enabled: bool = field(
        default=False, metadata=_h("Train a value model for GAE (PPO); off = critic-free.")
    )
    lr: float = field(default=1e-3, metadata=_h("Critic learning rate.", gt=0))
    value_clip: float | None = field(
        default=0.5, metadata=_h("Value clipping ε_v around the old values (null = off).", gt=0)
    )


@dataclass
class WarmStartConfig:
    steps: int = field(
        default=0,
        metadata=_h("Supervised steps on demonstrations before RL (0 = off).", ge=0, le=BIG),
    )
    lr: float = field(default=3e-3, metadata=_h("Warm-start learning rate.", gt=0))
    batch_size: int = field(default=32, metadata=_h("Warm-start batch size.", ge=1, le=100_000))


@dataclass
class EvalConfig:
    every: int = field(
        default=25,
        metadata=_h("Greedy evaluation every N steps (0 = only at the end).", ge=0, le=BIG),
    )
    n_prompts: int = field(
        default=64, metadata=_h("Held-out prompts per evaluation.", ge=1, le=100_000)
    )


@dataclass
class RunConfig:
    """One PPO training run."""

    seed: int = field(
        default=0, metadata=_h("Seed of model init, prompts and sampling.", ge=0, le=2**32 - 1)
    )
    steps: int = field(default=200, metadata=_h("Training steps (rollout + update).", ge=1, le=BIG))
    model: str = field(
        default="tiny",
        metadata=_h(
            "'tiny' or a local Hugging Face model directory (~ expanded; a relative path is "
            "relative to the current directory, not to the YAML file)."
        ),
    )
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig, metadata=_h("Tiny model shape."))
    model_options: ModelOptions = field(
        default_factory=ModelOptions,
        metadata=_h(
            "How the model is loaded and run: dtype, attn_implementation, trust_remote_code, "
            "gradient_checkpointing, lora."
        ),
    )
    task: str = field(
        default="reverse",
        metadata=_h(
            "reverse | add | sort | mixed-scale | jsonl:PATH | python:MODULE:FUNCTION"
            "[@PATH.jsonl] (JSONL lines {prompt, answer}; FUNCTION(prompt, completion, answer) "
            "-> float; paths: ~ expanded, relative to the current directory)."
        ),
    )
    task_options: dict[str, Any] = field(default_factory=dict, metadata=_h("Task keyword options."))
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata=_h("Sampling."))
    ppo: PPOActorConfig = field(default_factory=PPOActorConfig, metadata=_h("PPO actor."))
    optim: OptimConfig = field(default_factory=OptimConfig, metadata=_h("Policy optimizer."))
    critic: CriticConfig = field(default_factory=CriticConfig, metadata=_h("Value model."))
    warm_start: WarmStartConfig = field(
        default_factory=WarmStartConfig, metadata=_h("SFT warm-up.")
    )
    eval: EvalConfig = field(default_factory=EvalConfig, metadata=_h("Held-out evaluation."))
    device: str = field(default="cpu", metadata=_h("auto | cpu | cuda | cuda:N."))
    bf16: bool = field(
        default=False,
        metadata=_h("Shorthand for model_options.dtype=bfloat16 (autocast, CPU and CUDA)."),
    )
    threads: int = field(
        default=0, metadata=_h("torch CPU threads (0 = leave torch's default).", ge=0, le=1024)
    )
    trainer: Literal["harness", "trl"] = field(
        default="harness",
        metadata=_h(
            "Who trains the cell: the harness's PPO loop or TRL's GRPOTrainer (options mapped "
            "as in the README's TRL table; what TRL cannot express is an error)."
        ),
    )
    diverge_after: int = field(
        default=3,
        metadata=_h(
            "Consecutive steps whose every update was non-finite before a run counts as diverged.",
            ge=1,
            le=BIG,
        ),
    )

    def __post_init__(self) -> None:
        if self.bf16:
            self.model_options.dtype = "bfloat16"
        if self.model != "tiny":
            # YAML does no shell expansion: `model: ~/models/x` (the README's own example) would
            # otherwise name a directory literally called '~'.
            self.model = os.path.expanduser(self.model)
        dev = self.device
        if not is_device_name(dev):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {dev!r}")
        if self.model != "tiny" and not Path(self.model).is_dir():
            raise ValueError(
                f"model: directory {self.model!r} does not exist "
                "(use 'tiny' or a local Hugging Face model directory)"
            )
        if self.trainer == "trl":
            from harness.config.trl_map import trl_problems

            problems = trl_problems(self)
            if problems:
                where, why = problems[0]
                raise ValueError(f"{where}: not expressible with trainer: trl ({why})")
        for name, norm in (("adv_norm", self.ppo.adv_norm), ("reward_norm", self.ppo.reward_norm)):
            if norm is not None and norm.uses_groups:
                # The loop passes the real group sizes (to reward_norm and adv_norm alike); a
                # fixed group_size that disagrees with them would be silently ignored.
                if norm.group_size not in (1, self.rollout.n_samples):
                    raise ValueError(
                        f"ppo.{name}.group_size {norm.group_size} must equal rollout.n_samples "
                        f"({self.rollout.n_samples}) or be left at 1"
                    )


# Short names accepted for --set and experiment axes.
ALIASES = {"adv_norm": "ppo.adv_norm", "reward_norm": "ppo.reward_norm"}


def resolve_alias(path: str) -> str:
    head, _, rest = path.partition(".")
    if head in ALIASES:
        return ALIASES[head] + ("." + rest if rest else "")
    return path


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
    from harness.core.limits import MAX_YAML_BYTES, file_too_big

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: file not found")
    too_big = file_too_big(p, MAX_YAML_BYTES, "a run or experiment file")
    if too_big:  # refused before parsing: PyYAML takes minutes over hundreds of MB
        raise ConfigError(too_big)
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: is not a UTF-8 text file (byte {err.start}); expected a YAML file"
        ) from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
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
    ``overrides`` are never modified."""
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        set_path(out, resolve_alias(key), copy.deepcopy(value))
    return out


def expand_aliases(data: dict[str, Any]) -> dict[str, Any]:
    """Top-level ``adv_norm:``/``reward_norm:`` blocks move under ``ppo`` (in a deep copy)."""
    out = copy.deepcopy(data)
    for short, full in ALIASES.items():
        if short in out:
            value = out.pop(short)
            set_path(out, full, value)
    return out


def build_run_config(
    data: dict[str, Any] | None = None, overrides: list[str] | dict[str, Any] | None = None
) -> RunConfig:
    """defaults < data < overrides → validated RunConfig (raises ConfigError)."""
    merged = expand_aliases(data or {})
    if isinstance(overrides, list):
        overrides = dict(parse_override(o) for o in overrides)
    merged = apply_overrides(merged, overrides or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return from_dict(RunConfig, merged)


def validate_task(cfg: RunConfig) -> None:
    """Resolve the task spec now, so a bad task fails before anything runs or is written."""
    from harness.tasks import get_task

    try:
        task = get_task(cfg.task, **cfg.task_options)
    except (ValueError, TypeError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(msg if msg.startswith("task") else f"task: {msg}") from None
    from harness.config.preflight import check_lengths

    try:
        check_lengths(cfg, task)
        lora = cfg.model_options.lora
        if lora is not None:  # peft is installed: check_lengths says so otherwise
            from harness.model.lora import check_target_modules, model_modules

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


__all__ = [
    "ConfigError",
    "CriticConfig",
    "EvalConfig",
    "OptimConfig",
    "PPOActorConfig",
    "PPOConfig",
    "RolloutConfig",
    "RunConfig",
    "WarmStartConfig",
    "build_run_config",
    "load_run_config",
]
