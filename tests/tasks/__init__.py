"""Tests of harness.tasks."""
