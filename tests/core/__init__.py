"""Tests of harness.core."""
