"""The options of ``dranet webhook`` (:class:`WebhookOptions`), read from its flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from driver.config import DRIVER_NAME


@dataclass(frozen=True)
class WebhookOptions:
    """Everything ``dranet webhook`` needs, from its flags."""

    kubeconfig: str | None = None
    port: int = 9443
    host: str | None = None  # address the apiserver uses to reach us (URL in a managed config)
    listen: str | None = None  # None: all interfaces
    tls_cert: str | None = None
    tls_key: str | None = None
    manage_configuration: bool = False
    failure_policy: str = "Fail"
    driver_name: str = DRIVER_NAME  # whose opaque configs are judged (the node plugin's --driver-name)
    health_port: int = 0  # GET /healthz over plain HTTP, answered by the event loop (0: not served)


def options_from_args(args: argparse.Namespace) -> WebhookOptions:
    """:class:`WebhookOptions` from the ``dranet webhook`` flags (each flag's dest is a field name)."""
    return WebhookOptions(**{f.name: getattr(args, f.name) for f in fields(WebhookOptions) if hasattr(args, f.name)})
