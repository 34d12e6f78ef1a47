"""Remove secrets from URLs and log lines before they are printed, logged or tracked.

Storage and tracking URLs routinely carry a password (``postgresql://user:secret@host/db``).
They travel into error messages, MLflow params and tags, and config artifacts, so every place
that shows a URL goes through :func:`redact_url` or :func:`redact_text`. Redaction errs on the
side of hiding too much: a password containing an unescaped ``@`` hides part of the host too,
rather than leaking the tail of the password.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import quote

MASK = "***"

# Query or DSN keys whose values are secrets (``?password=...``, libpq ``password=...``).
SECRET_KEYS = (
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "access_token",
    "access_key",
    "secret_key",
    "sslpassword",
)

# scheme://user:password@ — the password runs to the last '@' of the whitespace-free token, so
# an unescaped '@' inside a password cannot leak what follows it.
_URL_USERINFO = re.compile(
    r"(?P<prefix>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@'\"]*):(?P<password>[^\s'\"]*)@"
)
_KEY_VALUE = re.compile(
    r"(?P<prefix>(?:^|(?<=[?&;\s,(\"']))(?:" + "|".join(SECRET_KEYS) + r")\s*=\s*)"
    r"(?P<value>[^&;\s,)\"']+)",
    re.IGNORECASE,
)


def redact_url(url: str) -> str:
    """Return ``url`` with its password, and any secret query parameter, replaced by ``***``.

    Works on any scheme (``postgresql://``, ``postgresql+psycopg2://``, ``http(s)://``,
    ``redis://``) and leaves URLs without credentials unchanged, so it is safe to call on every
    URL shown to a user. An empty password (``user:@host``) is left as it is.
    """
    scheme_sep = url.find("://")
    if scheme_sep >= 0:
        start = scheme_sep + 3
        # The authority ends at the first '/', '?' or '#' after the last '@' (an unescaped '@'
        # or '/' in a password must not end the userinfo early).
        at = url.rfind("@", start, _authority_limit(url, start))
        if at >= 0:
            userinfo = url[start:at]
            user, sep, password = userinfo.partition(":")
            if sep and password:
                url = f"{url[:start]}{user}:{MASK}{url[at:]}"
    return _KEY_VALUE.sub(lambda m: m.group("prefix") + MASK, url)


def _authority_limit(url: str, start: int) -> int:
    """Index where the authority of ``url`` ends, looking past '@'-containing passwords."""
    last_at = url.rfind("@", start, _first_of(url, "?#", start))
    search_from = last_at + 1 if last_at >= 0 else start
    return _first_of(url, "/?#", search_from)


def _first_of(text: str, chars: str, start: int) -> int:
    positions = [p for p in (text.find(c, start) for c in chars) if p >= 0]
    return min(positions) if positions else len(text)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Return ``text`` with URL passwords, ``password=...`` pairs and every known secret masked.

    Args:
        text: A log line, error message, param or tag value, or a whole config file.
        secrets: Literal secrets to hide wherever they appear (for example the password parsed
            from a storage URL). Their percent-encoded forms are hidden too, because URLs carry
            passwords encoded. Empty strings are ignored.

    Returns:
        The text with each secret replaced by ``***``.
    """
    text = _URL_USERINFO.sub(lambda m: f"{m.group('prefix')}:{MASK}@", text)
    text = _KEY_VALUE.sub(lambda m: m.group("prefix") + MASK, text)
    literals: set[str] = set()
    for secret in secrets:
        if secret:
            literals.update({secret, quote(secret, safe="")})
    # Longest first, so a secret that contains another one is masked whole.
    for literal in sorted(literals, key=len, reverse=True):
        text = text.replace(literal, MASK)
    return text


def url_secrets_redacted(text: str, url: str) -> str:
    """``text`` (a driver's error about ``url``) with ``url``'s password masked everywhere.

    A password with a raw ``@`` (``postgresql://u:p@ss@host/db``) is split by drivers at its
    first ``@``: they then report a host such as ``"ss@host"``.  The tails of the password that
    can appear that way are masked too, where an ``@`` follows them, so no fragment leaks.
    """
    password = url_password(url)
    if not password:
        return redact_text(text)
    for i, char in enumerate(password):
        if char == "@" and password[i + 1 :]:
            text = re.sub(re.escape(password[i + 1 :]) + "(?=@)", MASK, text)
    return redact_text(text, [password])


def escape_raw_at(url: str) -> str:
    """``url`` with each raw ``@`` of its user info written ``%40``, as URL syntax requires.

    Drivers split ``user:p@ss@host`` at the first ``@`` (and try to reach host ``ss@host``);
    the harness reads the user info up to the last ``@``, as :func:`redact_url` does, so such a
    password reaches the server whole.  Other URLs are returned unchanged.
    """
    scheme_sep = url.find("://")
    if scheme_sep < 0:
        return url
    start = scheme_sep + 3
    at = url.rfind("@", start, _authority_limit(url, start))
    if at < 0 or "@" not in url[start:at]:
        return url
    return url[:start] + url[start:at].replace("@", "%40") + url[at:]


def url_password(url: str) -> str | None:
    """Return the password embedded in ``url`` (as written, possibly percent-encoded), if any.

    Useful to pass to :func:`redact_text` so that the password is hidden even where it appears
    outside a URL, e.g. in a driver's error message.
    """
    scheme_sep = url.find("://")
    if scheme_sep < 0:
        return None
    start = scheme_sep + 3
    at = url.rfind("@", start, _authority_limit(url, start))
    if at < 0:
        return None
    _, sep, password = url[start:at].partition(":")
    return password if sep and password else None
