"""``dranet webhook``: kopf set up around the handler, and the entry point that runs it.

kopf runs with the smallest footprint it allows: standalone (no peering objects), cluster
scanning disabled (no watches on CRDs or namespaces), no event posting, and one validating
handler for both resources (:mod:`driver.webhook.handler`). The configuration is managed by
:mod:`driver.webhook.configuration` when asked, never by kopf.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import kopf
from kopf._core.engines.peering import Identity  # the NewType kopf.run expects (not re-exported)

from driver.webhook.certificates import TLSFiles, given, self_signed
from driver.webhook.configuration import OPERATIONS, ConfigurationManager
from driver.webhook.handler import HANDLER_ID, AnyPathWebhookServer, is_claim_resource, quiet_kopf_rejections, validator
from driver.webhook.options import WebhookOptions, options_from_args

log = logging.getLogger(__name__)


def build_registry(options: WebhookOptions, tls: TLSFiles) -> kopf.OperatorRegistry:
    """A registry with exactly one validator (both resources), a login handler and the settings.

    The server answers on any URL path (:class:`AnyPathWebhookServer`); the managed
    configuration uses ``/validate``.
    """
    registry = kopf.OperatorRegistry()
    quiet_kopf_rejections(options.driver_name)
    kopf.on.validate(
        is_claim_resource,
        id=HANDLER_ID,
        operations=list(OPERATIONS),
        ignore_failures=options.failure_policy == "Ignore",
        registry=registry,
    )(validator(options.driver_name))

    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(options.kubeconfig)

    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.scanning.disabled = True  # no CRD/namespace watches: resources found once at start
        settings.posting.enabled = False  # no k8s events from kopf's own logs
        settings.admission.server = AnyPathWebhookServer(
            addr=options.listen,
            port=options.port,
            host=options.host,
            certfile=tls.certfile,
            pkeyfile=tls.keyfile,
            cadata=tls.cadata,
        )
        # kopf's own management would also create an empty MutatingWebhookConfiguration (it
        # always manages both kinds); we manage only the validating one (ConfigurationManager).
        settings.admission.managed = None

    kopf.on.login(registry=registry)(login)
    kopf.on.startup(registry=registry)(configure)
    if options.manage_configuration:
        manager = ConfigurationManager(options, tls)
        kopf.on.startup(registry=registry)(manager.on_startup)
        kopf.on.cleanup(registry=registry)(manager.on_cleanup)
    return registry


def connection_info(kubeconfig: str | None) -> kopf.ConnectionInfo:
    """kopf credentials from a kubeconfig path (or the in-cluster service account)."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    cfg = k8s_client.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        k8s_config.load_incluster_config(client_configuration=cfg)
    if cfg.refresh_api_key_hook is not None:
        cfg.refresh_api_key_hook(cfg)  # in-cluster: re-read the rotated service account token
    auth = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken") or ""
    scheme, _, token = auth.partition(" ") if " " in auth else ("Bearer", "", auth)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        scheme=scheme if token else None,
        token=token or None,
    )


def operator_identity() -> str:
    """kopf's operator identity, made without looking the user up.

    kopf's default (``peering.detect_own_id``) calls ``getpass.getuser()``, which raises
    ``KeyError`` for a uid that has no passwd entry: the image's user 65532, or the random uid
    OpenShift assigns. The webhook runs standalone (no peering), so any unique string works.
    """
    return f"dranet-webhook@{socket.gethostname()}/{os.getpid()}"


def cli_webhook(args: argparse.Namespace) -> int:
    """``dranet webhook``: serve until SIGTERM/SIGINT."""
    options = options_from_args(args)
    if bool(options.tls_cert) != bool(options.tls_key):
        log.error("--tls-cert and --tls-key must be given together")
        return 2
    # A temp dir only for a generated certificate: with --tls-cert/--tls-key the webhook writes
    # nothing, so it runs on a read-only root filesystem (as the chart deploys it).
    with contextlib.ExitStack() as stack:
        if options.tls_cert and options.tls_key:
            tls = given(options.tls_cert, options.tls_key)
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="dranet-webhook-"))
            hosts = [h for h in (options.host, "127.0.0.1", "localhost") if h]
            tls = self_signed(Path(tmp), list(dict.fromkeys(hosts)))
            log.info("generated a self-signed webhook certificate", extra={"kv": {"sans": hosts, "dir": tmp}})
        registry = build_registry(options, tls)
        log.info(
            "starting webhook",
            extra={
                "kv": {
                    "port": options.port,
                    "host": options.host,
                    "managed": options.manage_configuration,
                    "failurePolicy": options.failure_policy,
                    "driverName": options.driver_name,
                    "healthPort": options.health_port,
                }
            },
        )
        # /healthz is answered by the loop that serves the reviews: a probe of it fails when that
        # loop is stuck, where a TCP probe (the kernel accepts the connection) would not.
        health = f"http://0.0.0.0:{options.health_port}/healthz" if options.health_port else None
        kopf.run(
            registry=registry,
            standalone=True,
            clusterwide=True,
            identity=Identity(operator_identity()),
            liveness_endpoint=health,
        )
    return 0
