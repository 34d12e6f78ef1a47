"""The run configuration: the typed tree (``schema``) and how it is read (``loading``).

defaults < file < ``--set``, validated once from the fields' declarations; see
``harness.config.schema`` for the dataclasses and ``harness.config.loading`` for YAML, overrides
and the one-line errors.
"""

from __future__ import annotations

from harness.config.loading import (
    ALIASES,
    MAX_YAML_VALUES,
    apply_overrides,
    build_run_config,
    expand_aliases,
    is_sampler_path,
    load_run_config,
    load_yaml,
    parse_yaml_text,
    resolve_alias,
    validate_task,
)
from harness.config.schema import (
    BIG,
    CriticConfig,
    EvalConfig,
    OptimConfig,
    RolloutConfig,
    RunConfig,
    WarmStartConfig,
)
from harness.core.configtools import ConfigError
from harness.ppo.config import PPOActorConfig, PPOConfig

__all__ = [
    "ALIASES",
    "BIG",
    "MAX_YAML_VALUES",
    "ConfigError",
    "CriticConfig",
    "EvalConfig",
    "OptimConfig",
    "PPOActorConfig",
    "PPOConfig",
    "RolloutConfig",
    "RunConfig",
    "WarmStartConfig",
    "apply_overrides",
    "build_run_config",
    "expand_aliases",
    "is_sampler_path",
    "load_run_config",
    "load_yaml",
    "parse_yaml_text",
    "resolve_alias",
    "validate_task",
]
