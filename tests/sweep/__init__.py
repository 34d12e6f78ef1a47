"""Tests of harness.sweep."""
