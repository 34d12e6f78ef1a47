"""The test suite, laid out like the harness package (tests/ppo tests harness/ppo, ...)."""
