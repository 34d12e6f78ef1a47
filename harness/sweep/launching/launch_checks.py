"""Where a sweep's workers run, checked before any store is opened: ``--launcher`` and its Ray
resources, ``--workers`` / ``--devices``, and the devices the cells ask for (a device this
machine does not have is one config error up front, not N failed trials)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.config import build_run_config
from harness.config.experiment import ExperimentSpec
from harness.core.configtools import ConfigError, is_device_name
from harness.sweep.launching.launchers.ray_checks import (
    check_shareable,
    import_ray,
    probe_address,
)

MAX_WORKERS = 256  # local worker processes; more is a typo, not a plan (each loads torch)


@dataclass(frozen=True)
class LaunchChoice:
    """--launcher and its resources, validated before any store is opened."""

    name: str = "local"
    ray_address: str | None = None
    gpus: float = 0.0
    cpus: float = 1.0


def launch_choice(
    launcher: str,
    ray_address: str | None,
    gpus: float,
    cpus: float,
    shared_fs: bool,
    storage: str | None,
    tracking_uri: str | None,
) -> LaunchChoice:
    """Check ``--launcher`` and its options; for Ray, that Ray imports, that the stores can be
    shared with its nodes and that the cluster answers."""
    if launcher not in ("local", "ray"):
        raise ConfigError(f"--launcher: must be local or ray; got {launcher!r}")
    for flag, v in (("--gpus-per-worker", gpus), ("--cpus-per-worker", cpus)):
        if not math.isfinite(v) or v < 0:
            raise ConfigError(f"{flag}: must be a number >= 0; got {v}")
    if launcher == "local":
        if ray_address is not None or gpus or cpus != 1.0 or shared_fs:
            raise ConfigError(
                "--ray-address, --gpus-per-worker, --cpus-per-worker and --shared-fs need "
                "--launcher ray"
            )
        return LaunchChoice()

    import_ray()
    check_shareable(storage, tracking_uri, address=ray_address, shared_fs=shared_fs)
    if ray_address is not None:
        probe_address(ray_address)
    return LaunchChoice("ray", ray_address, gpus, cpus)


def workers_and_devices(workers: int, devices: str | None) -> tuple[int, list[str] | None]:
    """--workers / --devices of `ablate` and `search`: validated; with devices and the default
    worker count, one worker per device."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"--workers: must be an integer in [1, {MAX_WORKERS}]; got {workers}")
    if not devices:
        return workers, None
    device_list = [d.strip() for d in devices.split(",")]
    for d in device_list:
        if not is_device_name(d, allow_auto=False):
            raise ConfigError(f"--devices: {d!r} is not cpu, cuda or cuda:N")
    return (len(device_list) if workers == 1 else workers), device_list


def devices_to_check(spec: ExperimentSpec, device_list: list[str] | None) -> tuple[list[str], str]:
    """The devices local workers will use: --devices, else every device the cells ask for."""
    if device_list:
        return device_list, "--devices"

    found = {str(build_run_config(spec.base).device)}
    for cell in getattr(spec, "cells", None) or []:
        if "device" in cell.overrides:
            found.add(str(cell.overrides["device"]))
    return sorted(found), "device"


def check_devices(devices: list[str], where: str) -> None:
    """A device this machine does not have is a config error up front, not N failed trials."""
    if all(d.strip().lower() == "cpu" for d in devices):
        return  # no torch import for the common case
    from harness.model.build import resolve_device  # noqa: PLC0415 - loads torch: only to resolve a device

    for d in devices:
        try:
            resolve_device(d)
        except ValueError as err:
            msg = str(err).splitlines()[0]
            raise ConfigError(msg.replace("device:", f"{where}:", 1)) from None
