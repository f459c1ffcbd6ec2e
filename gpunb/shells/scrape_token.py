"""A credential that reads ``/gpunb/metrics`` and nothing else, for a Prometheus scraper.

The server's own token (or a JupyterHub API token) can run code in every kernel: handing it to
a monitoring system hands that system the server. So the extension also accepts, on the
metrics endpoint only, a separate token that the administrator sets before the server starts:

- ``GPUNB_METRICS_TOKEN_FILE``: a file holding the token (this user's, writable by nobody
  else; read as an untrusted file), or
- ``GPUNB_METRICS_TOKEN``: the token itself.

At least 32 characters (``python -c "import secrets; print(secrets.token_urlsafe(32))"``).
Prometheus sends it as ``Authorization: Bearer <token>`` (``authorization.credentials_file``);
every other endpoint of the server treats it as no login at all (docs/security.md).
"""

from __future__ import annotations

import hmac
import os
import stat
from collections.abc import Mapping

from gpunb.readings.untrusted_file import Untrusted, read_bytes

ENV_TOKEN = "GPUNB_METRICS_TOKEN"
ENV_TOKEN_FILE = "GPUNB_METRICS_TOKEN_FILE"
MIN_LENGTH = 32


class ScrapeTokenError(Exception):
    """The configured scrape token cannot be used; the message says why and what to do."""


def load(environ: Mapping[str, str] | None = None) -> tuple[bytes | None, str]:
    """(the token, a warning for the server log) from the environment; (None, '') when none is
    configured. Raises :class:`ScrapeTokenError` for one that is configured but unusable."""
    env = os.environ if environ is None else environ
    path, value = env.get(ENV_TOKEN_FILE), env.get(ENV_TOKEN)
    warning = ""
    if path:
        try:
            value = read_bytes(path, owned=True, max_bytes=4096).decode().strip()
        except (Untrusted, UnicodeDecodeError) as exc:
            raise ScrapeTokenError(f"{ENV_TOKEN_FILE}: {exc}; the metrics endpoint accepts only the server's login "
                                   "until it is fixed") from None
        if os.stat(path).st_mode & (stat.S_IRGRP | stat.S_IROTH):
            warning = f"{path} is readable by other users: `chmod 600 {path}`"
    if not value:
        return None, ""
    if len(value) < MIN_LENGTH:
        raise ScrapeTokenError(f"the scrape token is {len(value)} characters, fewer than {MIN_LENGTH}; make one with "
                               "`python -c \"import secrets; print(secrets.token_urlsafe(32))\"`")
    return value.encode(), warning


def presented(authorization: str | None) -> bytes | None:
    """The token in an ``Authorization: Bearer <t>`` (or ``token <t>``) header."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() not in ("bearer", "token") or not token.strip():
        return None
    return token.strip().encode()


def matches(expected: bytes | None, authorization: str | None) -> bool:
    got = presented(authorization)
    return expected is not None and got is not None and hmac.compare_digest(expected, got)
