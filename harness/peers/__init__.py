"""Every TRL / verl / AReaL mapping, in one place: ``trl`` (a run config as TRL ``GRPOConfig``
keyword arguments, what TRL cannot express, the table of ``docs/trl.md``),
``corrections`` (a ``ppo.correction`` block in TRL's and verl's names) and ``export`` (a config as
TRL code, verl Hydra overrides or AReaL YAML, for ``harness export``).

These modules read a config's fields but never import the config layer, which sits above them:
``RunConfig`` refuses what ``trainer: trl`` cannot express when it is built.  Peer names an
objective or a correction declares for itself stay beside it in ``harness.ppo``."""
