"""A private Ray head for tests: loopback only, 2 CPUs, no dashboard, its own temp dir and ports,
stopped (with every process it started) when the test session ends."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ray_cli() -> str | None:
    exe = Path(sys.executable).parent / "ray"
    return str(exe) if exe.exists() else shutil.which("ray")


class PrivateRayHead:
    def __init__(self, num_cpus: int = 2) -> None:
        self.num_cpus = num_cpus
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Short: Ray puts AF_UNIX sockets under it (107-byte path limit).
        self.temp_dir = tempfile.mkdtemp(prefix="hray", dir="/tmp")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        cli = ray_cli()
        assert cli is not None, "ray is not installed"
        argv = [
            cli,
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={self.port}",
            f"--num-cpus={self.num_cpus}",
            "--num-gpus=0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
            "--object-store-memory=100000000",
            f"--dashboard-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            # Its default, 10001, is shared by every head on the machine: with two pytest
            # workers (or another session's head) the second one's client server cannot bind.
            f"--ray-client-server-port={free_port()}",
        ]
        # Loopback only, so no token: Ray 2.5x's token auth keeps one token per user in
        # ~/.ray, which concurrent heads of other sessions would overwrite under us.
        # `--node-ip-address=127.0.0.1` alone is replaced by the machine's routable IP (and Ray
        # then listens on every interface) unless multi-node clusters are off.
        env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            # SIGTERM stops the head at once, not after Ray's node drain (up to 30 s).
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        }
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stopped as one, by id
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    time.sleep(2)  # the GCS answers before the raylet has registered
                    return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("ray head did not come up")

    def session_pids(self) -> list[int]:
        """Processes of this head's session (their command lines name its temp dir)."""
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if self.temp_dir in cmd:
                pids.append(int(d.name))
        return pids

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGTERM to `ray start --block` makes it stop the processes it started.
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for pid in self.session_pids():  # anything of this session still alive, by id
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL) if self.proc else None
        except OSError:
            pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)
