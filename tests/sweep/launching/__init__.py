"""Tests of harness.sweep.launching: the driver, the launchers and the worker loop."""
