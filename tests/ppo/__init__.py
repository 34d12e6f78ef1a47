"""Tests of harness.ppo."""
