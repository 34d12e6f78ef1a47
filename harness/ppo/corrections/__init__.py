"""Training–inference-mismatch corrections (``ppo.correction``): one behaviour weight ρ and a
list of rejection filters, composable with every objective (they read ``PolicyInputs.w`` and
``m_loss``).  ``spec`` declares the block, ``compute`` evaluates it, one module per family
declares its named presets (``registry.PRESETS``), and ``docs`` renders the table
(``python -m harness.ppo.corrections``).  AReaL's ``rejection_sampling`` and legacy
``behave_imp_weight_mode`` are particular corrections (``areal``: ``behaviour_correction`` turns
them into one).  A block in TRL's and verl's settings is :mod:`harness.peers.corrections`."""

from __future__ import annotations

from harness.core.plugins import import_members
from harness.ppo.corrections.areal import (
    BEHAVE_MODES,
    RejectionSampling,
    behaviour_correction,
    behaviour_weights,
    from_rejection_sampling,
    legacy_to_rejection_sampling,
)
from harness.ppo.corrections.compute import CorrectionResult, apply_correction
from harness.ppo.corrections.registry import PRESETS, Preset, resolve
from harness.ppo.corrections.spec import Correction, Filter

# Every other module of this package is a family that registers its presets on import, so a new
# family is one file (docs and error messages list presets by rank, not by import order).
import_members(
    __name__, __path__, skip={"areal", "compute", "docs", "registry", "spec", "__main__"}
)

__all__ = [
    "BEHAVE_MODES",
    "PRESETS",
    "Correction",
    "CorrectionResult",
    "Filter",
    "Preset",
    "RejectionSampling",
    "apply_correction",
    "behaviour_correction",
    "behaviour_weights",
    "from_rejection_sampling",
    "legacy_to_rejection_sampling",
    "resolve",
]
