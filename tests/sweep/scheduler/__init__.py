"""Tests of harness.sweep.scheduler: the study spec, opening and reading a study, adaptive seeds."""
