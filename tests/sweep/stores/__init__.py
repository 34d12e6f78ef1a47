"""Tests of harness.sweep.stores: the Optuna storages, the journal and its lock, the adapter."""
