"""gpunb's Jupyter server extension: which notebook holds each GPU, as JSON and as
Prometheus metrics, and a guarded way to shut down an idle kernel that holds GPU memory.

Enabled by ``jupyter-config/jupyter_server_config.d/gpunb.json`` (installed with the
package); ``jupyter server extension disable gpunb`` turns it off. Endpoints, under the
server's base URL:

``GET  gpunb/api/gpus``                         devices, processes, kernels, notebooks (JSON)
``GET  gpunb/metrics``                          the same in Prometheus' text format (also with the
                                                scrape-only token, ``scrape_token.py``)
``POST gpunb/api/kernels/<id>/shutdown``        body ``{"confirm": "<id>", "force": false}``

Every handler needs the server's authentication (``@web.authenticated``: an API request
without a login gets 403, never a page) and authorization (``@authorized``; reading is
the ``gpunb`` resource, shutting down is ``write`` on ``kernels``, as the server's own
kernel API asks). The POST also needs the XSRF token when the login is a browser cookie
(``APIHandler``'s check; a token header is proof enough). The reads do not count as user
activity, so scrapes and monitors never keep an idle server from being culled.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated, authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.escape import json_encode

from gpunb.analysis.holders.gpus import HoldersReport
from gpunb.shells import scrape_token
from gpunb.shells.server_service import GpuReportService, Refusal
from gpunb.views.metrics_view import clean_label as log_safe  # control characters -> U+FFFD
from gpunb.views.metrics_view import metrics_text

AUTH_RESOURCE = "gpunb"
SERVICE_KEY = "gpunb_report_service"
SCRAPE_TOKEN_KEY = "gpunb_scrape_token"
# jupyter_server's kernel ids are UUIDs; anything else is not a kernel of this server.
_KERNEL_ID = r"(?P<kernel_id>[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"


def _json_body(report: HoldersReport) -> bytes:
    # json_encode also escapes "</": the body can never close a <script> it is pasted into.
    return json_encode(report.to_dict()).encode()


class _GpunbHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def service(self) -> GpuReportService:
        return self.settings[SERVICE_KEY]

    def _refuse(self, refusal: Refusal) -> None:
        self.set_status(refusal.status)
        self.finish(json_encode({"message": refusal.message}))


class GpusHandler(_GpunbHandler):
    _track_activity = False  # polling is not a user at work

    @web.authenticated
    @authorized(resource=AUTH_RESOURCE)
    async def get(self) -> None:
        try:
            body = await self.service.rendered("json", _json_body)
        except Refusal as refusal:
            return self._refuse(refusal)
        self.set_header("Content-Type", "application/json")
        self.finish(body)


class MetricsHandler(_GpunbHandler):
    """The metrics, for the server's own login or for the scrape-only token (which opens this
    handler and no other: the server's identity provider does not know it)."""

    _track_activity = False

    @allow_unauthenticated  # checked below: the scrape token, else the server's login and authorizer
    async def get(self) -> None:
        if scrape_token.matches(self.settings.get(SCRAPE_TOKEN_KEY), self.request.headers.get("Authorization")):
            return await self._metrics()
        checked = self._get_with_login()  # 403 without a login (tornado's wrapper may return None)
        if checked is not None:
            await checked

    @web.authenticated
    @authorized(action="read", resource=AUTH_RESOURCE)
    async def _get_with_login(self) -> None:
        await self._metrics()

    async def _metrics(self) -> None:
        try:
            body, content_type = await self.service.rendered("metrics", metrics_text)
        except Refusal as refusal:
            return self._refuse(refusal)
        self.finish(body, set_content_type=content_type)


class ShutdownHandler(_GpunbHandler):
    auth_resource = "kernels"

    @web.authenticated
    @authorized(action="write", resource="kernels")
    async def post(self, kernel_id: str) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            return self._refuse(Refusal(400, "the request body must be JSON: {\"confirm\": \"<kernel id>\"}"))
        if not isinstance(body, dict):
            return self._refuse(Refusal(400, "the request body must be a JSON object: {\"confirm\": \"<kernel id>\"}"))
        force = body.get("force", False)
        if not isinstance(force, bool):
            return self._refuse(Refusal(400, f'"force" must be true or false, got {force!r}'))
        try:
            result = await self.service.shutdown_idle_kernel(kernel_id, confirm=body.get("confirm"), force=force)
        except Refusal as refusal:
            return self._refuse(refusal)
        self.log.info("gpunb: shut down kernel %s (%s) to free GPU memory", log_safe(kernel_id),
                      log_safe(result.path or "no notebook"))  # a newline in a path cannot forge a log line
        self.finish(json_encode(result.to_dict()))


def handlers(base_url: str) -> list[tuple[str, Any]]:
    return [
        (url_path_join(base_url, "gpunb/api/gpus"), GpusHandler),
        (url_path_join(base_url, "gpunb/metrics"), MetricsHandler),
        (url_path_join(base_url, f"gpunb/api/kernels/{_KERNEL_ID}/shutdown"), ShutdownHandler),
    ]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Called by jupyter_server at start-up: register the handlers (no NVML call yet)."""
    web_app = serverapp.web_app
    service = GpuReportService(serverapp.kernel_manager, getattr(serverapp, "session_manager", None))
    web_app.settings[SERVICE_KEY] = service
    try:
        token, warning = scrape_token.load()
    except scrape_token.ScrapeTokenError as exc:
        token, warning = None, ""
        serverapp.log.error("gpunb: %s", log_safe(exc))
    scrape_token.forget_environment()  # the kernels this server starts never inherit the token
    web_app.settings[SCRAPE_TOKEN_KEY] = token
    if warning:
        serverapp.log.warning("gpunb: %s", log_safe(warning))
    if token is not None:
        serverapp.log.info("gpunb: a scrape-only token opens %sgpunb/metrics (and nothing else)",
                           web_app.settings["base_url"])
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
    # A notebook saved while a monitor runs must reopen without "Error displaying widget":
    # its live controls are left out of the file (shells/save_hook.py).
    from gpunb.shells.save_hook import drop_live_controls

    register = getattr(serverapp.contents_manager, "register_pre_save_hook", None)  # jupyter_server >= 2.0
    if register is not None:
        register(drop_live_controls)
    serverapp.log.info("gpunb: GPU holders at %sgpunb/api/gpus, Prometheus metrics at %sgpunb/metrics",
                       web_app.settings["base_url"], web_app.settings["base_url"])


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpunb.shells.server_extension"}]
