"""Tests of harness.metrics."""
