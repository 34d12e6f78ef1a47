"""Database helpers shared by the Optuna storage and the MLflow tracker: transient-error
detection, jittered-backoff retries, the psycopg2 driver pin and a fast connection probe.

A neutral module: it imports neither the sweep nor the tracker (nor, at import time, SQLAlchemy),
so both can use it without importing each other.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import random
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from harness.core.fsutil import is_disk_full
from harness.core.redact import escape_raw_at, redact_text, url_secrets_redacted

_logger = logging.getLogger(__name__)
_T = TypeVar("_T")

CONNECT_TIMEOUT_S = 5
OUTAGE_ENV = "HARNESS_STORAGE_OUTAGE_S"
DEFAULT_OUTAGE_S = 60.0


class StorageUnavailable(RuntimeError):
    """The database stayed unreachable for a whole retry budget.

    Not transient by definition (``is_transient_db_error`` is False for it), so an outer retry
    loop does not start the budget again: the caller stops cleanly instead, leaving its trial
    RUNNING for the heartbeat to hand to another worker, or to a resumed sweep.
    """


def outage_budget_s() -> float:
    """Seconds a storage call keeps retrying through an outage (``HARNESS_STORAGE_OUTAGE_S``,
    default 60; ``inf`` waits for the server however long it is down)."""
    raw = os.environ.get(OUTAGE_ENV, "")
    if not raw:
        return DEFAULT_OUTAGE_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0:  # also refuses nan
        raise ValueError(f"{OUTAGE_ENV}: must be a number of seconds > 0 or inf; got {raw!r}")
    return value


def url_scheme(url: str) -> str:
    """The base scheme of a store URL without its driver: ``postgresql+psycopg2://…`` →
    ``postgresql``; ``""`` for something that is not a URL (a bare path, ``journal``)."""
    return urlsplit(url).scheme.split("+", 1)[0] if "://" in url else ""


def is_transient_db_error(error: BaseException) -> bool:
    """True if ``error`` (or an error it wraps) is a lost or refused database connection.

    Optuna wraps SQLAlchemy errors raised at commit in ``StorageInternalError``, so the causes
    are inspected too. Integrity and programming errors are not transient, and neither is a
    full disk (SQLite's "database or disk is full" is an ``OperationalError`` too): retrying
    it only delays the one line that says so.
    """
    import sqlalchemy.exc as sa_exc

    if is_disk_full(error):
        return False

    transient: tuple[type[BaseException], ...] = (
        sa_exc.OperationalError,
        sa_exc.InterfaceError,
        sa_exc.DisconnectionError,
        ConnectionError,
    )
    try:
        import psycopg2

        transient += (psycopg2.OperationalError, psycopg2.InterfaceError)
    except ImportError:  # pragma: no cover - psycopg2 is a dependency
        pass
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, StorageUnavailable):
            return False
        if isinstance(seen, transient):
            return True
        if isinstance(seen, sa_exc.DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def with_retries(
    fn: Callable[[], _T],
    *,
    attempts: int = 8,
    base_delay: float = 0.5,
    max_delay: float = 15.0,
    retry_on: Callable[[BaseException], bool] = is_transient_db_error,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[BaseException], None] | None = None,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> _T:
    """Call ``fn()``; on a transient database error wait and try again, up to ``attempts`` times.

    Waits grow as ``base_delay * 2**k`` (capped at ``max_delay``) with ±50 % jitter so that
    workers reconnecting after a restart do not arrive in lockstep; the defaults ride out
    about a minute of downtime. Other errors, and the last transient one, propagate.

    Retrying is only safe for calls that a second try leaves as one did: a write whose commit
    landed while the connection dropped raises but took effect. The Optuna storage handles its
    own such writes (``ResilientRDBStorage`` reads a token back before repeating a claim, a
    tell or a create); anything else retried here must be idempotent itself.

    With ``budget_s`` the number of attempts is unbounded and the budget is time instead: once
    the next wait would end past ``budget_s`` seconds from the first call, the last transient
    error is raised as :class:`StorageUnavailable` (which no retry loop retries again).
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1; got {attempts}")
    began = clock()
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as error:
            if not retry_on(error):
                raise
            delay = min(base_delay * 2 ** min(attempt, 30), max_delay) * (0.5 + random.random())
            if budget_s is not None:
                waited = clock() - began
                if waited >= budget_s:
                    raise StorageUnavailable(
                        f"database unavailable for {waited:.0f} s, longer than the {budget_s:g} s "
                        f"retry budget ({OUTAGE_ENV}): {short_reason(error)}"
                    ) from error
                delay = min(delay, budget_s - waited)  # one last try as the budget ends
            elif attempt == attempts - 1:
                raise
            if on_retry is not None:
                on_retry(error)
            _logger.warning(
                "database unavailable (%s); retry %d%s in %.1f s",
                short_reason(error),
                attempt + 1,
                "" if budget_s is not None else f"/{attempts - 1}",
                delay,
            )
            sleep(delay)
            attempt += 1


def sqlalchemy_url(url: str) -> str:
    """Pin ``postgresql://`` to the installed driver: ``postgresql+psycopg2://`` without psycopg 3.

    SQLAlchemy 2.1 made psycopg 3 the default driver of a bare ``postgresql://`` URL, while the
    harness depends on ``psycopg2-binary``; without this, every PostgreSQL URL fails with
    "No module named 'psycopg'". URLs that name a driver keep it.  A raw ``@`` in the password
    is escaped (``%40``) so the driver reaches the host the user meant (see ``escape_raw_at``).
    """
    url = escape_raw_at(url)
    if not url.startswith("postgresql://"):
        return url

    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2"):
        return "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    return url


def database_connect_error(url: str, *, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Try one connection to the SQL database at ``url``; return a short reason, or None if OK.

    Used before handing a URL to Optuna or MLflow, both of which otherwise retry (MLflow) or
    block (libpq's default has no connect timeout) for minutes on an unreachable server.
    """
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    connect_args: dict[str, Any] = {}
    if url.startswith("postgresql"):
        connect_args["connect_timeout"] = max(1, int(timeout))
    try:
        engine = sqlalchemy.create_engine(
            sqlalchemy_url(url), poolclass=NullPool, connect_args=connect_args
        )
    except Exception as error:  # bad URL syntax or a missing driver
        return short_reason(error, url)
    try:
        with engine.connect():
            return None
    except Exception as error:
        return short_reason(error, url)
    finally:
        engine.dispose()


def short_reason(error: BaseException, url: str | None = None) -> str:
    """One line, password-free explanation of a driver error (``Connection refused``).

    Looks through wrappers (Optuna's ``StorageInternalError`` says only "An exception is raised
    during the commit") down to the driver's own error.
    """
    cause: BaseException = error
    seen: BaseException | None = error
    while seen is not None:
        orig = getattr(seen, "orig", None)
        if isinstance(orig, BaseException):
            cause = orig
            break
        cause = seen
        seen = seen.__cause__
    text = str(cause).strip() or type(cause).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # libpq: 'connection to server at "h" (ip), port p failed: <reason>' — keep the reason.
    reasons = [m.group(1) for line in lines if (m := re.search(r"failed: (.+)$", line))]
    line = reasons[-1] if reasons else lines[0]
    if line.startswith("FATAL:"):
        line = line.removeprefix("FATAL:").strip()
    return (url_secrets_redacted(line, url) if url else redact_text(line))[:200]
