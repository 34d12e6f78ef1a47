"""The checks every objective's tests make: its loss through the config and on one row, and its
bad options refused in one line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.config import ConfigError, build_run_config
from harness.core.configtools import from_dict
from harness.ppo import PPOActorConfig
from harness.ppo.objectives import objective_loss


def assert_config_and_one_row(
    name: str,
    loss: Callable[..., tuple[torch.Tensor, dict[str, Any]]],
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    agg: str,
    stat: str,
) -> None:
    """``policy_loss: name`` through ``PPOActorConfig`` gives ``loss`` itself, bit for bit, on
    ``batch`` (ℓθ, ℓb, A, mask; ℓb is the proximal policy too) under ``agg``; the first row
    without its batch dimension gives the loss of the one-row batch, and its per-token ``stat``
    has the row's shape."""
    lt, lb, adv, mask = batch
    cfg = from_dict(PPOActorConfig, {"policy_loss": name, "loss_agg_mode": agg})
    got, _ = objective_loss(cfg, lt, lb, lb, adv, mask)
    want, _ = loss(lt, lb, lb, adv, mask, loss_agg_mode=agg)
    assert got.item() == want.item()
    row, st = loss(lt[0], lb[0], lb[0], adv[0], mask[0], loss_agg_mode=agg)
    one, _ = loss(lt[:1], lb[:1], lb[:1], adv[:1], mask[:1], loss_agg_mode=agg)
    assert row.item() == one.item() and st[stat].shape == (lt.shape[1],)


def assert_refused_in_one_line(over: dict[str, Any], msg: str) -> None:
    """The run config with ``over`` set is refused by one ``ConfigError`` line containing
    ``msg``."""
    with pytest.raises(ConfigError) as err:
        build_run_config({}, over)
    assert msg in str(err.value) and "\n" not in str(err.value)
