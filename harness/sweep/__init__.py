"""Sweeps, in four rooms, each importing only the rooms below it:

- ``stores``: the Optuna storages and the checks before they are opened;
- ``scheduler``: the study spec, opening and reading a study, which trial runs next;
- ``present``: tables, progress, finishing and exporting a study, the UIs;
- ``launching``: the driver, the launchers and the worker loop.
"""
