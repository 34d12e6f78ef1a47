"""Every TRL / verl / AReaL mapping, in one place: ``trl`` (a run config as TRL ``GRPOConfig``
keyword arguments, what TRL cannot express, the table of ``docs/trl.md``),
``corrections`` (a ``ppo.correction`` block in TRL's and verl's names) and ``export`` (a config as
TRL code, verl Hydra overrides or AReaL YAML, for ``harness export``).

These modules read a ``RunConfig`` and sit above the config layer, which never imports them:
``trl`` registers what ``trainer: trl`` cannot express with it (``harness.config.trainer_checks``),
so a config is refused when it is built.  Peer names an objective or a correction declares for
itself stay beside it in ``harness.ppo``."""
