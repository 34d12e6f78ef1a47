"""Checks of a tracking URI before anything is written: credentials that MLflow cannot use, and a
probe of a PostgreSQL or HTTP store (a few seconds, instead of MLflow's minutes of retrying)."""

from __future__ import annotations

import base64
import os
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from harness.core.configtools import ConfigError
from harness.core.db import database_connect_error, url_scheme
from harness.core.redact import redact_text, redact_url

CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def check_http_credentials(uri: str) -> None:
    """Refuse ``http(s)://user:pass@host``: MLflow's REST client (urllib/requests) cannot log in
    with credentials in the URL, and a URL is printed, logged and seen in process lists.
    MLflow's own environment variables carry them instead.

    Raises:
        ValueError: naming the variables to use, with the password redacted.
    """
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https") and (parts.username or parts.password):
        raise ValueError(
            f"tracking_uri: {redact_url(uri)} has credentials in the URL, which MLflow cannot use; "
            f"give the URL without them and set {CREDENTIAL_ENV[0]} and {CREDENTIAL_ENV[1]} "
            "(or MLFLOW_TRACKING_TOKEN) in the environment"
        )


def _auth_headers() -> dict[str, str]:
    """The Authorization header MLflow's client sends, from the same environment variables."""
    user, password = (os.environ.get(k) for k in CREDENTIAL_ENV)
    if user and password:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"}
    return {}


def _http_get(url: str, headers: dict[str, str], timeout: float) -> tuple[int | None, str | None]:
    """GET ``url``: ``(HTTP error code or None, why it could not be reached or None)``."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout):
            return None, None
    except urllib.error.HTTPError as error:  # it answered, so it is reachable
        return error.code, None
    except (urllib.error.URLError, OSError) as error:
        return None, redact_text(str(getattr(error, "reason", error)))


def probe_store(uri: str, scheme: str, timeout: float = 5.0) -> str | None:
    """Return why the store at ``uri`` cannot be reached or refuses us, or None if it answers."""
    if scheme == "postgresql":
        return database_connect_error(uri, timeout=timeout)
    base = uri.rstrip("/")
    code, unreachable = _http_get(f"{base}/health", {}, timeout)
    if unreachable is not None:
        return unreachable
    if code is not None and code >= 500:
        return f"HTTP {code}"
    # /health needs no login; an API call does, on a server with authentication.
    headers = _auth_headers()
    code, unreachable = _http_get(
        f"{base}/api/2.0/mlflow/experiments/search?max_results=1", headers, timeout
    )
    if code in (401, 403):
        given = "were refused" if headers else "are required"
        return f"HTTP {code}: credentials {given}; set {CREDENTIAL_ENV[0]} and {CREDENTIAL_ENV[1]}"
    # Any other HTTP error: an old or unusual server, whose MLflow client will say more.
    return unreachable


# ------------------------------------------------------------------ a command's --tracking-uri


def check_sqlite_path(flag: str, path: str, *, writable: bool = True) -> None:
    """sqlite:///PATH must name a file in an existing directory: SQLAlchemy/MLflow would
    otherwise create the directories (anywhere on the machine) or use an in-memory database.
    ``writable``: and a command that writes it must be able to (read-only commands need not)."""
    if not path or path.endswith("/"):
        raise ConfigError(f"{flag}: sqlite:///PATH needs a database file path; got {path!r}")
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{flag}: {path!r} is a directory; name a database file in it")
    if not target.parent.is_dir():
        raise ConfigError(
            f"{flag}: directory {str(target.parent)!r} does not exist (create it first)"
        )
    problem = _sqlite_write_problem(target) if writable else None
    if problem is not None:
        raise ConfigError(f"{flag}: cannot write the SQLite database {path!r} ({problem})")


def _sqlite_write_problem(target: Path) -> str | None:
    """Why SQLite could not write ``target`` (and its ``-journal``/``.lock`` files beside it),
    or None.  Tried, not read from the mode bits: root passes every permission check, yet a
    read-only mount or a pseudo-filesystem such as /proc still refuses the write, which MLflow
    would only report later as a long traceback.  The probe file is removed at once."""
    if target.exists():
        if not target.is_file():
            return "not a regular file"
        try:
            os.close(os.open(target, os.O_RDWR))
        except OSError as err:
            return err.strerror or str(err)
    probe = target.parent / f".{target.name}.write-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as err:
        return f"directory not writable: {err.strerror or err}"
    try:
        probe.unlink()
    except OSError:
        pass  # created but not removable: still writable, which is what is asked
    return None


def check_tracking_scheme(uri: str | None) -> None:
    """``--tracking-uri``'s scheme and credentials, checked without a connection (so that a bad
    URL fails before anything is written)."""
    if uri in (None, "memory"):
        return
    scheme = url_scheme(uri)
    if scheme not in ("sqlite", "postgresql", "http", "https"):
        raise ConfigError(
            f"--tracking-uri: scheme {scheme or redact_url(uri)!r} is not supported "
            "(use sqlite:///PATH, http(s)://HOST:PORT or postgresql://...)"
        )
    try:
        check_http_credentials(uri)
    except ValueError as error:
        raise ConfigError(f"--{error}".replace("--tracking_uri", "--tracking-uri", 1)) from None


def probe_tracking_uri(uri: str | None) -> None:
    """Connect to a remote tracking store (PostgreSQL, HTTP) before anything is created locally,
    so that an unreachable server leaves no results dir or mlflow.db behind."""
    if uri in (None, "memory"):
        return
    scheme = url_scheme(uri)
    if scheme != "sqlite":
        reason = probe_store(uri, scheme)
        if reason is not None:
            raise ConfigError(f"tracking_uri: cannot connect to {redact_url(uri)} ({reason})")
