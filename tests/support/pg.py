"""A private, throwaway PostgreSQL server for tests (no system service, no network exposure).

``PrivatePostgres`` runs ``initdb`` into a fresh temporary directory, starts the server on a
free loopback port with its socket in that directory, and removes everything on ``stop()``.
TCP logins need a password (SCRAM), so tests also exercise password redaction; the local
socket trusts its owner. PostgreSQL refuses to run as root, so as root every server binary
runs as the ``postgres`` user through ``runuser``. Durability is switched off (``fsync=off``):
the cluster only lives as long as the test session.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PG_BIN_ENV = "HARNESS_PG_BIN"
DEFAULT_DB = "harness_test"


def find_pg_bin() -> Path | None:
    """Directory holding ``initdb`` and ``pg_ctl``: ``$HARNESS_PG_BIN``, Debian's layout, PATH."""
    candidates = [os.environ.get(PG_BIN_ENV, "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    which = shutil.which("pg_ctl")
    candidates.append(str(Path(which).parent) if which else "")
    for candidate in candidates:
        if (
            candidate
            and (Path(candidate) / "initdb").exists()
            and (Path(candidate) / "pg_ctl").exists()
        ):
            return Path(candidate)
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """One private cluster: ``start()``, ``url``, ``create_database()``, ``restart()``, ``stop()``.

    ``start_seconds`` is the measured time from ``initdb`` to a server accepting connections.
    """

    user = "postgres"

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.password = "pw-" + secrets.token_hex(8)
        self.port = 0
        self.root = Path(tempfile.mkdtemp(prefix="harness-pg-"))
        self.data_dir = self.root / "data"
        self.log_file = self.root / "server.log"
        self.start_seconds = 0.0  # initdb + start, measured by start()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._owner = (entry.pw_uid, entry.pw_gid)
        os.chmod(self.root, 0o700)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, attempts: int = 3) -> PrivatePostgres:
        """initdb, then start on a free port (another port if that one was taken meanwhile)."""
        began = time.perf_counter()
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._as_postgres:
            os.chown(pwfile, *self._owner)
        self._run(
            "initdb",
            "-D", str(self.data_dir),
            "-U", self.user,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E", "UTF8",
            "--no-sync",
            "--no-instructions",
        )  # fmt: skip
        pwfile.unlink()
        for attempt in range(attempts):
            self.port = free_port()
            try:
                self._pg_ctl("start")
                break
            except subprocess.CalledProcessError:
                if attempt == attempts - 1:
                    raise RuntimeError(f"postgres did not start:\n{self.server_log()}") from None
        self.create_database(DEFAULT_DB)
        self.start_seconds = time.perf_counter() - began
        return self

    def stop(self) -> None:
        """Stop the server immediately and delete the cluster; safe to call twice."""
        if (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run(
                    "pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "-t", "300", "stop"
                )
        shutil.rmtree(self.root, ignore_errors=True)

    def restart(self, down_seconds: float = 0.0) -> None:
        """Simulate an outage: stop (fast: connections are cut), wait, start on the same port."""
        self.stop_server()
        time.sleep(down_seconds)
        self.start_server()

    def stop_server(self) -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "300", "stop")

    def start_server(self) -> None:
        self._pg_ctl("start")

    # -- databases ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """URL of the default test database, with the password."""
        return self.url_for(DEFAULT_DB)

    def url_for(self, database: str) -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its URL (a fresh database isolates a test)."""
        import psycopg2

        # A safety net, not a latency check: a loaded machine can take seconds to fork a backend.
        conn = psycopg2.connect(self.url_for("postgres"), connect_timeout=60)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url_for(name)

    def server_log(self) -> str:
        try:
            return self.log_file.read_text()[-4000:]
        except OSError:
            return ""

    # -- plumbing -----------------------------------------------------------------------------

    def _pg_ctl(self, action: str) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=200"
        )
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file),
            "-o", options, "-w", "-t", "300", action,
        )  # fmt: skip

    def _run(self, binary: str, *args: str) -> None:
        command = [str(self.bin_dir / binary), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        # pg_ctl -w returns as soon as the server is up (or down); the bounds only stop a hang:
        # initdb and a start take seconds idle, minutes on a loaded 2-core machine.
        subprocess.run(command, check=True, capture_output=True, timeout=600)
