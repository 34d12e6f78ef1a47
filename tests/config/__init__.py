"""Tests of harness.config."""
