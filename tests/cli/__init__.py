"""Tests of harness.cli."""
