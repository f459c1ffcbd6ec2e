"""A credential that reads ``/gpunb/metrics`` and nothing else, for a Prometheus scraper.

The server's own token (or a JupyterHub API token) can run code in every kernel: handing it to
a monitoring system hands that system the server. So the extension also accepts, on the
metrics endpoint only, a separate token that the administrator sets before the server starts:

- ``GPUNB_METRICS_TOKEN_FILE``: a file holding the token (this user's, readable and writable
  by nobody else: a token file others can read is refused, as OpenSSH refuses such a key), or
- ``GPUNB_METRICS_TOKEN``: the token itself (not under JupyterHub: a value set once in the hub's
  spawner environment would be the same for every user, and each user could read it in their
  own kernel and scrape every other user's metrics; there, one file per user is required).

At least 32 characters (``python -c "import secrets; print(secrets.token_urlsafe(32))"``).
Prometheus sends it as ``Authorization: Bearer <token>`` (``authorization.credentials_file``);
every other endpoint of the server treats it as no login at all (docs/security.md). Both
variables leave the server's environment when the extension loads (:func:`forget_environment`),
so the kernels it starts never inherit them.
"""

from __future__ import annotations

import hmac
import os
import stat
from collections.abc import Mapping, MutableMapping

from gpunb.readings.untrusted_file import Untrusted, read_bytes_stat

ENV_TOKEN = "GPUNB_METRICS_TOKEN"
ENV_TOKEN_FILE = "GPUNB_METRICS_TOKEN_FILE"
MIN_LENGTH = 32
HUB_MARKERS = ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_SERVICE_PREFIX")  # a JupyterHub single-user server


class ScrapeTokenError(Exception):
    """The configured scrape token cannot be used; the message says why and what to do."""


def load(environ: Mapping[str, str] | None = None) -> tuple[bytes | None, str]:
    """(the token, a note for the server log) from the environment; (None, '') when none is
    configured. Raises :class:`ScrapeTokenError` for one that is configured but unusable."""
    env = os.environ if environ is None else environ
    path, value = env.get(ENV_TOKEN_FILE), env.get(ENV_TOKEN)
    if path:
        try:
            data, st = read_bytes_stat(path, owned=True, max_bytes=4096)
            value = data.decode().strip()
        except (Untrusted, UnicodeDecodeError) as exc:
            raise ScrapeTokenError(f"{ENV_TOKEN_FILE}: {exc}; the metrics endpoint accepts only the server's login "
                                   "until it is fixed") from None
        if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
            raise ScrapeTokenError(f"{path} is readable by other users (mode {stat.S_IMODE(st.st_mode):04o}): anyone "
                                   f"who reads it reads this server's metrics; `chmod 600 {path}` and restart")
    elif value and any(env.get(k) for k in HUB_MARKERS):
        raise ScrapeTokenError(f"{ENV_TOKEN} is refused under JupyterHub: one value in the spawner's environment is "
                               "every user's, and each can read it in a kernel; give each user's server its own "
                               f"token file ({ENV_TOKEN_FILE}, docs/security.md)")
    if not value:
        return None, ""
    if len(value) < MIN_LENGTH:
        raise ScrapeTokenError(f"the scrape token is {len(value)} characters, fewer than {MIN_LENGTH}; make one with "
                               "`python -c \"import secrets; print(secrets.token_urlsafe(32))\"`")
    return value.encode(), ""


def forget_environment(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Remove the token's variables from the server's environment (kernels copy it when they
    start); the names removed."""
    env = os.environ if environ is None else environ
    return [name for name in (ENV_TOKEN, ENV_TOKEN_FILE) if env.pop(name, None) is not None]


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
