"""``profile: <name>``: the profile provider's config for a NIC, merged under the claim's, and its release.

At NodePrepareResources a device whose config names a profile gets the provider's config for it
(dranet's ``POST /GetProfileConfig``: the NIC's identifiers, the whole ResourceClaim, the claim's
config). The answer is decoded as strictly as a claim config, with every error naming the field
*and* the profile and endpoint it came from, then merged **under** the claim's config the way a
cloud provider's is ("user wins": :func:`~driver.api.v1alpha1.merge.merge_under_cloud`). At
NodeUnprepareResources the provider is told to free it (``POST /ReleaseProfileConfig`` with the
claim UID and the stored config), best effort as dranet: a failure is logged, never retried,
and never blocks the unprepare (the provider reclaims leaks itself). A prepare that fails after
a profile was resolved releases it again at once.

An endpoint that is down, slow or refuses fails the claim's prepare with the reason; the kubelet
retries NodePrepareResources, and the provider is expected to answer a retry for the same
(device, claim UID) with the same allocation (dranet's contract).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from driver.api.v1alpha1.decode import combination_errors, decode_config
from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.merge import merge_under_cloud
from driver.api.v1alpha1.network_config import NetworkConfig
from driver.config import DRIVER_NAME, PROFILE_WEBHOOK_TIMEOUT, DriverConfig
from driver.model.device import Device
from driver.profiles.provider_client import PATH_GET_PROFILE_CONFIG, DeviceIdentifiers, ProviderClient, ProviderError

log = logging.getLogger(__name__)


class ProfileError(Exception):
    """A profile could not be resolved for a NIC; the message is the claim's error."""


def identifiers(device: Device) -> DeviceIdentifiers:
    """dranet's ``DeviceIdentifiersFromDevice``: interface name, MAC and PCI address as published."""
    attrs = device.attributes

    def text(name: str) -> str:
        value = attrs.get(f"{DRIVER_NAME}/{name}")
        return value if isinstance(value, str) else ""

    return DeviceIdentifiers(
        name=text("ifName") or device.host.ifname or "",
        mac_address=text("mac"),
        pci_address=text("pciAddress") or device.host.pci_address or "",
    )


def wire_config(config: NetworkConfig) -> dict[str, Any]:
    """The config as dranet's ``NetworkConfig`` JSON (our canonical form without apiVersion/kind)."""
    out = config.to_parameters()
    out.pop("apiVersion", None)
    out.pop("kind", None)
    return out


@dataclass
class ProfileResolver:
    """Resolves and releases profiles through one webhook provider (``--webhook-url``)."""

    client: ProviderClient
    _capable: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self) -> None:
        """Ask ``/health`` once until it answers: :class:`ProviderError` when it cannot be asked, and
        :class:`ProfileError` when the provider says it is no profile provider (dranet refuses both
        at start; here a provider down at start only fails the prepares that need it, until it is up)."""
        with self._lock:
            if self._capable:
                return
            caps = self.client.capabilities()
            if not caps.profile_provider:
                raise ProfileError(
                    f"the webhook at {self.client.url} is not a profile provider (profileProvider: false)"
                )
            self._capable = True

    def resolve(self, claim: dict[str, Any], device: Device, config: NetworkConfig) -> tuple[NetworkConfig, bool]:
        """(``config`` with its profile's config merged under it, whether a profile was resolved).

        :class:`ProfileError` naming the profile, the endpoint and the reason (unreachable,
        refused with its HTTP status and message, or an answer that is not a valid config).
        """
        name = config.profile
        if not name:
            return config, False
        source = f"profile {name!r} ({self.client.url}{PATH_GET_PROFILE_CONFIG})"
        try:
            self.check()
            answer = self.client.get_profile_config(identifiers(device), claim, wire_config(config))
        except (ProviderError, ProfileError) as exc:
            raise ProfileError(f"profile {name!r}: {exc}") from None
        try:
            profile = decode_config({} if answer is None else answer, f"{source}: answer")
            merged = merge_under_cloud(profile, config)
            errors = combination_errors(merged, f"{source}: answer merged under the claim's config")
            if errors:
                raise ConfigError.of(errors)
        except ConfigError as exc:
            # The provider allocated what it answered: give it back, this claim will not use it.
            self.release((claim.get("metadata") or {}).get("uid", ""), device, config)
            raise ProfileError(f"{exc}") from None
        log.info(
            "profile resolved",
            extra={"kv": {"profile": name, "device": device.name, "config": wire_config(profile)}},
        )
        return merged, True

    def release(self, claim_uid: str, device: Device, config: NetworkConfig) -> str:
        """Tell the provider to free ``config``'s profile for the claim; "" or the reason it failed (logged)."""
        if not config.profile:
            return ""
        try:
            self.client.release_profile_config(identifiers(device), claim_uid, wire_config(config))
        except ProviderError as exc:
            log.warning(
                "profile not released: the provider must reclaim it itself",
                extra={"kv": {"profile": config.profile, "claim": claim_uid, "device": device.name, "error": str(exc)}},
            )
            return exc.reason
        log.info(
            "profile released", extra={"kv": {"profile": config.profile, "claim": claim_uid, "device": device.name}}
        )
        return ""

    def release_devices(self, claim_uid: str, devices: list[tuple[Device, NetworkConfig]]) -> None:
        """:meth:`release` for every ``(device, config)`` of a claim with a profile (unprepare, a failed prepare)."""
        for device, config in devices:
            if config.profile:
                self.release(claim_uid, device, config)


def profile_resolver(config: DriverConfig) -> ProfileResolver | None:
    """The resolver ``--profile-provider``/``--webhook-url`` ask for, or None (``cloud``, ``none``:
    no profile provider here). ``ValueError`` naming the flag when they cannot work."""
    if config.profile_provider != "webhook":
        return None
    if not config.webhook_url:
        raise ValueError("--profile-provider=webhook: --webhook-url is required")
    return ProfileResolver(ProviderClient(config.webhook_url, PROFILE_WEBHOOK_TIMEOUT))


def check_at_start(resolver: ProfileResolver) -> str:
    """Ask the provider's ``/health`` at daemon start: "" when it is a profile provider or cannot be
    reached yet (logged: prepares that need it fail, retried by the kubelet, until it answers),
    else why it cannot serve profiles (the daemon refuses to start, as dranet)."""
    try:
        resolver.check()
    except ProfileError as exc:
        return str(exc)
    except ProviderError as exc:
        log.warning("profile provider not reachable yet", extra={"kv": {"error": exc.reason}})
    return ""
