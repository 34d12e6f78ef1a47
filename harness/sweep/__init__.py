"""Sweeps: Optuna storages and the pieces that schedule (cell, seed) trials."""
