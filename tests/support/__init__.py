"""Helpers shared by the tests: private servers, tiny models, stand-ins for peer code."""
