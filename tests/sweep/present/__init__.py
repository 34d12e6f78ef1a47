"""Tests of harness.sweep.present: tables, progress, finishing and exporting a study, the UIs."""
