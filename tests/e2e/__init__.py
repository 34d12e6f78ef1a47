"""Whole-CLI journeys and the checks that keep the README and docs/ in step with the code."""
