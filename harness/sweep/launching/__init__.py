"""Running a sweep: the driver (open, launch, finish), the launchers (local processes, Ray,
a command per worker), the checks before a launch, the coordinator lock, and the worker loop."""
