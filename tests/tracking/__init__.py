"""Tests of harness.tracking."""
