"""Tests of harness.model."""
