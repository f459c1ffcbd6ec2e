"""No login, no data; no XSRF token, no action; no authorization, neither."""

from __future__ import annotations

import json
import uuid
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from jupyter_server.auth import Authorizer
from tornado.httpclient import HTTPClientError

ENDPOINTS = (
    ("GET", ("gpunb", "api", "gpus"), None),
    ("GET", ("gpunb", "metrics"), None),
    ("POST", ("gpunb", "api", "kernels", str(uuid.uuid4()), "shutdown"), json.dumps({"confirm": "x"})),
)


async def _code(jp_fetch, method, parts, body, **kwargs) -> int:
    try:
        r = await jp_fetch(*parts, method=method, body=body, follow_redirects=False, **kwargs)
    except HTTPClientError as err:
        return err.code
    return r.code


@pytest.mark.parametrize("auth", ["", "token not-the-token", "bearer not-the-token"])
async def test_nothing_without_a_valid_login(jp_fetch, fake_gpu, auth):
    for method, parts, body in ENDPOINTS:
        assert await _code(jp_fetch, method, parts, body, headers={"Authorization": auth}) == 403, parts


@pytest.mark.parametrize("jp_server_config", [{"ServerApp": {
    "jpserver_extensions": {"gpunb": True, "jupyter_server_terminals": False},  # (its websocket would warn)
    "allow_unauthenticated_access": False}}])
async def test_the_same_where_the_server_forbids_any_unauthenticated_handler(jp_fetch, fake_gpu):
    for method, parts, body in ENDPOINTS:
        assert await _code(jp_fetch, method, parts, body, headers={"Authorization": ""}) == 403, parts
    assert await _code(jp_fetch, *ENDPOINTS[0]) == 200


async def test_a_cookie_login_can_read_but_acts_only_with_the_xsrf_token(jp_fetch, fake_gpu):
    r = await jp_fetch("gpunb", "api", "gpus")  # token login: the server sets its login cookie
    login = next(c.split(";")[0] for c in r.headers.get_list("Set-Cookie") if c.startswith("username-"))
    browser = {"Authorization": "", "Cookie": login}
    assert await _code(jp_fetch, "GET", ("gpunb", "api", "gpus"), None, headers=browser) == 200
    method, parts, body = ENDPOINTS[2]
    assert await _code(jp_fetch, method, parts, body, headers=browser) == 403  # a cross-site form could do this
    xsrf = "5f3c9a0e" * 4
    with_xsrf = dict(browser, Cookie=f"{login}; _xsrf={xsrf}", **{"X-XSRFToken": xsrf})
    # Past the XSRF check: refused only because no such kernel runs here.
    assert await _code(jp_fetch, method, parts, body, headers=with_xsrf) == 404


class DenyGpunb(Authorizer):
    """Allows everything but reading gpunb's data and writing kernels."""

    asked: ClassVar[list[tuple[str, str]]] = []

    def is_authorized(self, handler, user, action, resource):
        DenyGpunb.asked.append((action, resource))
        return not (resource == "gpunb" or (resource, action) == ("kernels", "write"))


@pytest.mark.parametrize("jp_server_config", [{"ServerApp": {"jpserver_extensions": {"gpunb": True},
                                                             "authorizer_class": DenyGpunb}}])
async def test_the_servers_authorizer_decides(jp_fetch, fake_gpu):
    DenyGpunb.asked.clear()
    assert await _code(jp_fetch, "GET", ("api", "status"), None) == 200  # the login itself is fine
    for method, parts, body in ENDPOINTS:
        assert await _code(jp_fetch, method, parts, body) == 403, parts
    assert ("read", "gpunb") in DenyGpunb.asked and ("write", "kernels") in DenyGpunb.asked


SCRAPE = "s" * 8 + "-scrape-only-token-for-prometheus-0123"


@pytest.fixture
def scrape_token(tmp_path, monkeypatch):
    """The scrape-only token, set (in a 0600 file) before the server starts."""
    f = tmp_path / "scrape-token"
    f.write_text(SCRAPE + "\n")
    f.chmod(0o600)
    monkeypatch.setenv("GPUNB_METRICS_TOKEN_FILE", str(f))
    return SCRAPE


async def test_the_scrape_token_reads_the_metrics_and_nothing_else(scrape_token, jp_fetch, fake_gpu):
    bearer = {"Authorization": f"Bearer {scrape_token}"}
    r = await jp_fetch("gpunb", "metrics", headers=bearer)
    assert r.code == 200 and b"gpunb_nvml_up 1.0" in r.body
    for method, parts, body in [*ENDPOINTS[::2], ("GET", ("api", "status"), None), ("GET", ("api", "kernels"), None),
                                ("GET", ("api", "contents"), None), ("POST", ("api", "kernels"), "{}")]:
        assert await _code(jp_fetch, method, parts, body, headers=bearer) == 403, parts
    assert await _code(jp_fetch, "GET", ("gpunb", "metrics"), None,
                       headers={"Authorization": f"Bearer {scrape_token[:-1]}x"}) == 403
    assert await _code(jp_fetch, "GET", ("gpunb", "metrics"), None) == 200  # the server's own login still works


@pytest.mark.parametrize("jp_server_config", [{"ServerApp": {
    "jpserver_extensions": {"gpunb": True, "jupyter_server_terminals": False},
    "allow_unauthenticated_access": False}}])
async def test_the_scrape_token_where_the_server_forbids_unauthenticated_handlers(scrape_token, jp_fetch, fake_gpu):
    assert await _code(jp_fetch, "GET", ("gpunb", "metrics"), None,
                       headers={"Authorization": f"Bearer {scrape_token}"}) == 200
    assert await _code(jp_fetch, "GET", ("gpunb", "metrics"), None, headers={"Authorization": ""}) == 403


def test_a_weak_or_unsafe_scrape_token_is_refused_with_the_fix(tmp_path):
    from gpunb.shells import scrape_token as st

    assert st.load({}) == (None, "")
    with pytest.raises(st.ScrapeTokenError, match="fewer than 32"):
        st.load({"GPUNB_METRICS_TOKEN": "short"})
    f = tmp_path / "t"
    f.write_text(SCRAPE)
    f.chmod(0o622)
    with pytest.raises(st.ScrapeTokenError, match="writable by other users"):
        st.load({"GPUNB_METRICS_TOKEN_FILE": str(f)})
    f.chmod(0o644)  # issue 31: readable by others was accepted with a warning
    with pytest.raises(st.ScrapeTokenError, match=r"readable by other users.*chmod 600"):
        st.load({"GPUNB_METRICS_TOKEN_FILE": str(f)})
    f.chmod(0o600)
    token, warning = st.load({"GPUNB_METRICS_TOKEN_FILE": str(f)})
    assert token == SCRAPE.encode() and warning == ""
    assert not st.matches(token, "Basic " + SCRAPE) and st.matches(token, "bearer " + SCRAPE)


def test_under_jupyterhub_a_shared_token_variable_is_refused_and_a_per_user_file_works(tmp_path):
    """Issue 31: one GPUNB_METRICS_TOKEN in the hub's spawner environment was every user's."""
    from gpunb.shells import scrape_token as st

    hub = {"JUPYTERHUB_API_TOKEN": "hub", "GPUNB_METRICS_TOKEN": SCRAPE}
    with pytest.raises(st.ScrapeTokenError, match=r"refused under JupyterHub.*its own token file"):
        st.load(hub)
    f = tmp_path / "gpunb-metrics-token"
    f.write_text(SCRAPE)
    f.chmod(0o600)
    assert st.load({**hub, "GPUNB_METRICS_TOKEN_FILE": str(f)})[0] == SCRAPE.encode()


async def test_kernels_never_inherit_the_token(scrape_token, jp_fetch, jp_serverapp, monkeypatch):
    """The variables leave the server's environment when the extension loads: a kernel started
    afterwards (its environment is a copy of the server's) cannot read the token."""
    import os

    from tests.server.conftest import run_in_kernel, start_session

    assert "GPUNB_METRICS_TOKEN_FILE" not in os.environ and "GPUNB_METRICS_TOKEN" not in os.environ
    session = await start_session(jp_fetch, "user.ipynb")
    out = await run_in_kernel(jp_serverapp, session["kernel"]["id"],
                              "import os; print(sorted(k for k in os.environ if k.startswith('GPUNB_METRICS')))")
    assert out.strip() == "[]"
    r = await jp_fetch("gpunb", "metrics", headers={"Authorization": f"Bearer {scrape_token}"})
    assert r.code == 200  # the server kept the token it read


@settings(max_examples=300, deadline=None)
@given(path=hst.text())
def test_a_newline_in_a_notebook_path_cannot_forge_the_shutdown_log_line(path):
    """Any path (generated): what gpunb logs of it is one line of printable characters."""
    from gpunb.shells.server_extension import log_safe

    forged = "a.ipynb) to free GPU memory\n[I 2026-12-05 ServerApp] gpunb: shut down kernel admin (secrets.ipynb"
    assert "\n" not in log_safe(forged) and "\ufffd" in log_safe(forged)
    shown = log_safe(path)
    assert len(shown) == len(path) and all(ch.isprintable() or ch == " " for ch in shown)
    assert shown.splitlines() in ([shown], [])
