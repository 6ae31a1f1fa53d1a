"""``dranet webhook``: a kopf validating admission webhook for dra.net claim configs.

It validates ResourceClaims and ResourceClaimTemplates (``resource.k8s.io/v1``) on CREATE and
UPDATE with the same validator as NodePrepareResources and ``dranet validate``
(:func:`driver.claims.validation.validate_claim_spec`); only configs with ``opaque.driver: dra.net``
are looked at. A rejection lists every problem as ``<field path>: <reason>``.

kopf runs with the smallest footprint it allows: standalone (no peering objects), cluster
scanning disabled (no watches on CRDs or namespaces), no event posting, and one validating
handler for both resources. TLS comes from ``--tls-cert``/``--tls-key`` or, when absent, a self-signed
CA and server certificate generated at start (SANs: ``--host``, 127.0.0.1, localhost).
With ``--manage-configuration`` we apply the ValidatingWebhookConfiguration ``dra.net-webhook``
(server-side apply, URL from ``--host``/``--port`` and the caBundle) once the server listens,
and empty its webhook list on exit (kopf's own management would also create an empty
MutatingWebhookConfiguration); otherwise one from the chart is used, pointing
at ``https://<service>:<port>/<any path>`` (every path validates by resource).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import ipaddress
import logging
import os
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf
from kopf._core.engines.admission import WebhookError  # not exported; _serve is kopf-internal too
from kopf._core.engines.peering import Identity  # the NewType kopf.run expects (not re-exported)

from driver.admission import Malformed, denial, parse_review
from driver.claims.validation import validate_claim_spec
from driver.config import DRIVER_NAME

log = logging.getLogger(__name__)

MANAGED_CONFIGURATION = f"{DRIVER_NAME}-webhook"
GROUP, VERSION = "resource.k8s.io", "v1"
HANDLER_ID = "validate"  # also the URL path of the managed configuration
REJECTION_PREFIX = f"invalid {DRIVER_NAME} config: "
# plural -> where the claim spec sits in the object (the path used in error messages)
SPEC_PATHS = {"resourceclaims": ("spec",), "resourceclaimtemplates": ("spec", "spec")}


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


def review(plural: str, body: dict[str, Any]) -> list[str]:
    """``path: reason`` for every problem in a claim or template object (empty when valid)."""
    keys = SPEC_PATHS[plural]
    spec: Any = body
    for key in keys:
        spec = spec.get(key) if isinstance(spec, dict) else None
    if spec is None:
        return []
    return [f"{e.path}: {e.reason}" for err in validate_claim_spec(spec, ".".join(keys)) for e in err.errors]


def _is_claim_resource(resource: Any) -> bool:
    """kopf resource selector: ResourceClaims and ResourceClaimTemplates of resource.k8s.io/v1."""
    return resource.group == GROUP and resource.version == VERSION and resource.plural in SPEC_PATHS


def validate(body: kopf.Body, resource: Any, old: Any = None, operation: str | None = None, **_: Any) -> None:
    """The kopf handler: reject with every ``path: reason`` found (HTTP 422).

    On UPDATE only a changed spec is judged: a claim created before the webhook existed must
    still accept metadata updates (labels, and the finalizer removal that lets it be deleted).
    """
    if operation == "UPDATE" and isinstance(old, Mapping) and old.get("spec") == body.get("spec"):
        return
    problems = review(resource.plural, dict(body))
    if problems:
        meta = body.get("metadata") or {}
        log.info(
            "rejected",
            extra={
                "kv": {
                    "resource": resource.plural,
                    "namespace": meta.get("namespace"),
                    "name": meta.get("name"),
                    "operation": operation,
                    "problems": problems,
                }
            },
        )
        raise kopf.AdmissionError(REJECTION_PREFIX + "; ".join(problems), code=422)


class AnyPathWebhookServer(kopf.WebhookServer):
    """kopf's TLS webhook server, answering on every URL path with every matching handler.

    Stock kopf runs only the handlers whose id equals the URL path and *allows* a request on
    any other path (no handler, no objection): a configuration with a different path (the
    chart's ``/validate-resourceclaims``) would silently validate nothing. Dropping the path
    hint makes kopf pick handlers by resource alone. Relies on kopf's ``_serve`` (kopf 1.x).

    The body is parsed here, bounded (:func:`driver.admission.parse_review`), before kopf sees
    it: a body that is not an AdmissionReview gets HTTP 400 with the reason, a review that
    cannot be judged (no object, nested too deep) a 200 ``allowed: false``; a failure inside
    kopf is denied the same way. Never a 500, never a stack trace in a response.
    """

    @staticmethod
    async def _serve(fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        parsed = parse_review(await request.read())
        if isinstance(parsed, Malformed):
            log.info("malformed admission request", extra={"kv": {"reason": parsed.message}})
            return aiohttp.web.Response(status=400, text=parsed.message + "\n")
        if parsed.denial:
            log.info("rejected", extra={"kv": {"uid": parsed.uid, "problems": [parsed.denial]}})
            return aiohttp.web.json_response(denial(parsed, f"{REJECTION_PREFIX}{parsed.denial}"))
        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            # webhook=None: handlers are picked by resource, whatever the URL path.
            response = await fn(parsed.body, webhook=None, headers=headers, sslpeer=sslpeer or {})  # type: ignore[arg-type]
        except WebhookError as exc:  # no handler for this resource: kopf's own 400, as stock kopf
            return aiohttp.web.Response(status=400, text=f"{exc}\n")
        except Exception as exc:
            log.exception("admission request failed", extra={"kv": {"uid": parsed.uid}})
            return aiohttp.web.json_response(denial(parsed, f"dra.net webhook internal error: {exc}", code=500))
        return aiohttp.web.json_response(response)


class _QuietRejections(logging.Filter):
    """kopf logs every handler exception at ERROR, our rejections too ("Handler 'validate' failed
    permanently: invalid dra.net config: ..."). A rejection is a user error, already logged at
    INFO with the claim's namespace/name by :func:`validate`: drop kopf's copy."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.levelno >= logging.ERROR and f"failed permanently: {REJECTION_PREFIX}" in record.getMessage()
        )


def build_registry(options: WebhookOptions, tls: TLSFiles) -> kopf.OperatorRegistry:
    """A registry with exactly one validator (both resources), a login handler and the settings.

    The server answers on any URL path (:class:`AnyPathWebhookServer`); the managed
    configuration uses ``/validate``.
    """
    registry = kopf.OperatorRegistry()
    kopf_objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietRejections) for f in kopf_objects.filters):
        kopf_objects.addFilter(_QuietRejections())
    kopf.on.validate(
        _is_claim_resource,
        id=HANDLER_ID,
        operations=["CREATE", "UPDATE"],
        ignore_failures=options.failure_policy == "Ignore",
        registry=registry,
    )(validate)

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


def webhook_configuration(options: WebhookOptions, cadata: bytes | None) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration ``dranet webhook --manage-configuration`` applies."""
    host = options.host or "127.0.0.1"
    client_config: dict[str, Any] = {"url": f"https://{_url_host(host)}:{options.port}/{HANDLER_ID}"}
    if cadata:
        client_config["caBundle"] = base64.b64encode(cadata).decode("ascii")
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": MANAGED_CONFIGURATION},
        "webhooks": [
            {
                "name": f"{plural}.{DRIVER_NAME}",
                "rules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": [VERSION],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [plural],
                        "scope": "Namespaced",
                    }
                ],
                # Only objects that carry a config for this driver: other drivers' claims never
                # depend on this webhook being up (same conditions as the chart's).
                "matchConditions": [{"name": f"has-{DRIVER_NAME.replace('.', '-')}-config", "expression": expr}],
                "failurePolicy": options.failure_policy,
                "matchPolicy": "Equivalent",  # also sees v1beta1/v1beta2 requests, converted to v1
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
                "clientConfig": client_config,
            }
            for plural, expr in sorted(match_conditions().items())
        ],
    }


def match_conditions() -> dict[str, str]:
    """Per resource, the CEL condition under which the API server calls the webhook at all."""
    out = {}
    for plural, keys in SPEC_PATHS.items():
        spec = ".".join(("object", *keys))
        guards = [f"has({spec.rsplit('.', 1)[0]}.{keys[-1]})"] if len(keys) > 1 else []
        guards += [f"has({spec}.devices)", f"has({spec}.devices.config)"]
        out[plural] = " && ".join(
            [*guards, f"{spec}.devices.config.exists(c, has(c.opaque) && c.opaque.driver == {DRIVER_NAME!r})"]
        )
    return out


def _url_host(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


class ConfigurationManager:
    """Applies the ValidatingWebhookConfiguration once the server answers; empties it on exit.

    Registered only after the TLS port accepts connections, so ``failurePolicy: Fail`` never
    meets a webhook that is not listening yet. On shutdown the webhook list is emptied (not the
    object deleted): the API server stops calling a webhook that is gone. Run a single replica
    in this mode; with several, use the chart's configuration instead.
    """

    FIELD_MANAGER = MANAGED_CONFIGURATION

    def __init__(self, options: WebhookOptions, tls: TLSFiles) -> None:
        self.options = options
        self.tls = tls
        self._task: asyncio.Task[None] | None = None

    def _apply(self, body: dict[str, Any]) -> None:
        from driver.kube.client import KubeClient

        kube = KubeClient.from_kubeconfig(self.options.kubeconfig)
        kube.apply_validating_webhook_configuration(MANAGED_CONFIGURATION, body, self.FIELD_MANAGER)

    async def _register_when_listening(self) -> None:
        host = self.options.listen or "127.0.0.1"
        while True:
            try:
                _, writer = await asyncio.open_connection(host, self.options.port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        body = webhook_configuration(self.options, self.tls.cadata)
        delay = 0.5
        while True:
            try:
                await asyncio.to_thread(self._apply, body)
                log.info(
                    "webhook configuration applied",
                    extra={"kv": {"name": MANAGED_CONFIGURATION, "url": body["webhooks"][0]["clientConfig"]["url"]}},
                )
                return
            except Exception as exc:  # noqa: BLE001 - keep serving; retry with backoff
                log.error("cannot apply the webhook configuration", extra={"kv": {"error": str(exc)}})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def on_startup(self, **_: Any) -> None:
        """kopf startup: register in the background (the server starts after startup handlers)."""
        self._task = asyncio.create_task(self._register_when_listening())

    async def on_cleanup(self, **_: Any) -> None:
        """kopf cleanup: stop registering and empty the webhook list."""
        if self._task is not None:
            self._task.cancel()
        body = webhook_configuration(self.options, self.tls.cadata)
        body["webhooks"] = []
        try:
            await asyncio.to_thread(self._apply, body)
        except Exception as exc:  # noqa: BLE001 - best effort on the way out
            log.error("cannot empty the webhook configuration", extra={"kv": {"error": str(exc)}})


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


@dataclass(frozen=True)
class TLSFiles:
    """The server's certificate and key files, and the CA bundle clients need (PEM)."""

    certfile: str
    keyfile: str
    cadata: bytes | None


def self_signed(directory: Path, hosts: list[str]) -> TLSFiles:
    """A throwaway CA and a server certificate for ``hosts`` (IPs or DNS names), valid 1 year."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dra.net webhook CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    certfile, keyfile = directory / "tls.crt", directory / "tls.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.touch(mode=0o600)
    keyfile.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cadata = ca.public_bytes(serialization.Encoding.PEM)
    (directory / "ca.crt").write_bytes(cadata)
    return TLSFiles(str(certfile), str(keyfile), cadata)


def operator_identity() -> str:
    """kopf's operator identity, made without looking the user up.

    kopf's default (``peering.detect_own_id``) calls ``getpass.getuser()``, which raises
    ``KeyError`` for a uid that has no passwd entry: the image's user 65532, or the random uid
    OpenShift assigns. The webhook runs standalone (no peering), so any unique string works.
    """
    return f"dranet-webhook@{socket.gethostname()}/{os.getpid()}"


def options_from_args(args: argparse.Namespace) -> WebhookOptions:
    """:class:`WebhookOptions` from the ``dranet webhook`` flags (each flag's dest is a field name)."""
    return WebhookOptions(**{f.name: getattr(args, f.name) for f in fields(WebhookOptions) if hasattr(args, f.name)})


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
            # caBundle for a managed configuration: a ca.crt next to the certificate (as in a
            # cert-manager or kubernetes.io/tls secret mount), else the certificate file itself
            # (right for a self-signed leaf or a file holding the chain up to the CA).
            ca_file = Path(options.tls_cert).with_name("ca.crt")
            cadata = (ca_file if ca_file.exists() else Path(options.tls_cert)).read_bytes()
            tls = TLSFiles(options.tls_cert, options.tls_key, cadata)
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
                }
            },
        )
        kopf.run(registry=registry, standalone=True, clusterwide=True, identity=Identity(operator_identity()))
    return 0
