"""The ValidatingWebhookConfiguration of ``dranet webhook --manage-configuration``.

With ``--manage-configuration`` we apply the ValidatingWebhookConfiguration ``dra.net-webhook``
(server-side apply, URL from ``--host``/``--port`` and the caBundle) once the server listens,
and empty its webhook list on exit; otherwise one from the chart is used, pointing
at ``https://<service>:<port>/<any path>`` (every path validates by resource). Either way the
API server calls the webhook only for objects that carry a ``dra.net`` config (:func:`match_conditions`).
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
from typing import Any, Literal

from driver.config import DRIVER_NAME
from driver.webhook.certificates import TLSFiles
from driver.webhook.handler import GROUP, HANDLER_ID, SPEC_PATHS, VERSION
from driver.webhook.options import WebhookOptions

log = logging.getLogger(__name__)

OPERATIONS: tuple[Literal["CREATE"], ...] = ("CREATE",)
"""What the webhook judges: a claim's and a template's spec are immutable, so UPDATEs (the
scheduler's finalizer, labels, the finalizer's removal) never change a config and never wait
for the webhook (with ``failurePolicy: Fail`` a dead webhook would otherwise block allocation
and deletion of existing claims)."""


def configuration_name(driver_name: str) -> str:
    """The name of the ValidatingWebhookConfiguration ``--manage-configuration`` owns."""
    return f"{driver_name}-webhook"


MANAGED_CONFIGURATION = configuration_name(DRIVER_NAME)


def webhook_configuration(options: WebhookOptions, cadata: bytes | None) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration ``dranet webhook --manage-configuration`` applies."""
    host = options.host or "127.0.0.1"
    client_config: dict[str, Any] = {"url": f"https://{_url_host(host)}:{options.port}/{HANDLER_ID}"}
    if cadata:
        client_config["caBundle"] = base64.b64encode(cadata).decode("ascii")
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": configuration_name(options.driver_name)},
        "webhooks": [
            {
                "name": f"{plural}.{options.driver_name}",
                "rules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": [VERSION],
                        "operations": list(OPERATIONS),
                        "resources": [plural],
                        "scope": "Namespaced",
                    }
                ],
                # Only objects that carry a config for this driver: other drivers' claims never
                # depend on this webhook being up (same conditions as the chart's).
                "matchConditions": [
                    {"name": f"has-{options.driver_name.replace('.', '-')}-config", "expression": expr}
                ],
                "failurePolicy": options.failure_policy,
                "matchPolicy": "Equivalent",  # also sees v1beta1/v1beta2 requests, converted to v1
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
                "clientConfig": client_config,
            }
            for plural, expr in sorted(match_conditions(options.driver_name).items())
        ],
    }


def match_conditions(driver_name: str = DRIVER_NAME) -> dict[str, str]:
    """Per resource, the CEL condition under which the API server calls the webhook at all."""
    out = {}
    for plural, keys in SPEC_PATHS.items():
        spec = ".".join(("object", *keys))
        guards = [f"has({spec.rsplit('.', 1)[0]}.{keys[-1]})"] if len(keys) > 1 else []
        guards += [f"has({spec}.devices)", f"has({spec}.devices.config)"]
        out[plural] = " && ".join(
            [*guards, f"{spec}.devices.config.exists(c, has(c.opaque) && c.opaque.driver == {driver_name!r})"]
        )
    return out


def _url_host(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


class ConfigurationManager:
    """Applies the ValidatingWebhookConfiguration once the server answers; empties it on exit.

    Started only after the TLS port accepts connections, so ``failurePolicy: Fail`` never
    meets a webhook that is not listening yet. On shutdown the webhook list is emptied (not the
    object deleted): the API server stops calling a webhook that is gone. Run a single replica
    in this mode; with several, use the chart's configuration instead.
    """

    def __init__(self, options: WebhookOptions, tls: TLSFiles) -> None:
        self.options = options
        self.tls = tls
        self._task: asyncio.Task[None] | None = None

    def _apply(self, body: dict[str, Any]) -> None:
        from driver.kube.client import KubeClient

        kube = KubeClient.from_kubeconfig(self.options.kubeconfig)
        name = configuration_name(self.options.driver_name)
        kube.apply_validating_webhook_configuration(name, body, field_manager=name)

    async def _register(self) -> None:
        body = webhook_configuration(self.options, self.tls.cadata)
        delay = 0.5
        while True:
            try:
                await asyncio.to_thread(self._apply, body)
                log.info(
                    "webhook configuration applied",
                    extra={"kv": {"name": body["metadata"]["name"], "url": body["webhooks"][0]["clientConfig"]["url"]}},
                )
                return
            except Exception as exc:  # noqa: BLE001 - keep serving; retry with backoff
                log.error("cannot apply the webhook configuration", extra={"kv": {"error": str(exc)}})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def start(self) -> None:
        """Apply the configuration in the background (retried until the API server takes it)."""
        self._task = asyncio.create_task(self._register())

    async def stop(self) -> None:
        """Stop applying and empty the webhook list."""
        if self._task is not None:
            self._task.cancel()
        body = webhook_configuration(self.options, self.tls.cadata)
        body["webhooks"] = []
        try:
            await asyncio.to_thread(self._apply, body)
        except Exception as exc:  # noqa: BLE001 - best effort on the way out
            log.error("cannot empty the webhook configuration", extra={"kv": {"error": str(exc)}})
