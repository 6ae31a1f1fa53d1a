"""The cloud metadata of this node, fetched in the background and applied to every scan.

:class:`CloudMetadata` detects the provider (or takes ``--cloud-provider``) and fetches the
instance metadata in its own thread, retrying with backoff (5 s doubling to 5 min) while the
service is down, slow or answers garbage; the first failure is logged once at warning level, later
ones at debug. Until the metadata arrives every scan publishes without cloud attributes; when it
arrives ``on_change`` asks for a rescan, which republishes with them. Discovery never waits on it
except for the bounded :meth:`CloudMetadata.wait` at daemon start (a few seconds, so a healthy
service's attributes are in the very first publish).

Instance metadata does not change while the VM runs, so it is fetched once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.inventory import attributes as attrs
from driver.inventory.attributes import D
from driver.inventory.cloud.base import CloudInstance, DeviceIdentifiers
from driver.inventory.cloud.detection import AUTO, BY_NAME, NONE, Provider, detect
from driver.inventory.cloud.metadata import MetadataClient
from driver.model.device import Device

log = logging.getLogger(__name__)

RETRY_INITIAL = 5.0
RETRY_MAX = 300.0


class CloudMetadata:
    """This node's cloud instance metadata, once it is known; thread-safe."""

    def __init__(
        self,
        provider: str = AUTO,
        client: MetadataClient | None = None,
        sysfs_root: str = "/sys",
        on_change: Callable[[], None] | None = None,
        *,
        retry_initial: float = RETRY_INITIAL,
        retry_max: float = RETRY_MAX,
    ) -> None:
        """``provider``: ``auto``, ``none`` or a provider name (see ``detection.CHOICES``)."""
        if provider not in (AUTO, NONE) and provider not in BY_NAME:
            raise ValueError(f"unknown cloud provider {provider!r}")
        self.provider = provider
        self.client = client or MetadataClient()
        self.sysfs_root = sysfs_root
        self.on_change = on_change
        self.retry_initial, self.retry_max = retry_initial, retry_max
        self._instance: CloudInstance | None = None
        self._done = threading.Event()  # an instance arrived, or there is nothing to wait for
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()
        self._failed_devices: set[str] = set()
        self.attempts = 0
        if provider == NONE:
            self._done.set()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background fetch (nothing to do for ``none``)."""
        if self.provider == NONE or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="cloud-metadata", daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the metadata; True when it is here."""
        self._done.wait(timeout)
        return self._instance is not None

    def stop(self) -> None:
        """Stop retrying (the thread exits at its next wake-up)."""
        self._stop.set()

    @property
    def instance(self) -> CloudInstance | None:
        """The fetched metadata, or None (not yet, or not in a cloud)."""
        return self._instance

    def fetch_once(self) -> CloudInstance | None:
        """One detection (for ``auto``) and fetch; failures are logged (once per kind) and return None."""
        self.attempts += 1
        provider: Provider | None
        if self.provider == AUTO:
            provider = detect(self.client)
            if provider is None:
                self._log_once(
                    "detect",
                    logging.INFO,
                    "no cloud metadata service answered; publishing without cloud attributes",
                    retry_s=self.retry_max,
                )
                return None
        else:
            provider = BY_NAME[self.provider]
        try:
            instance = provider.fetch(self.client)
        except Exception as exc:  # noqa: BLE001 - down, slow, garbage: never more than a log line
            self._log_once(
                f"fetch-{provider.name}",
                logging.WARNING,
                "cloud metadata unavailable; publishing without cloud attributes, retrying in the background",
                provider=provider.name,
                error=str(exc),
            )
            return None
        log.info("cloud metadata", extra={"kv": {"provider": provider.name, **instance.summary()}})
        return instance

    def _run(self) -> None:
        delay = self.retry_initial
        while not self._stop.is_set():
            instance = self.fetch_once()
            if instance is not None:
                self._instance = instance
                self._done.set()
                if self.on_change is not None:
                    try:
                        self.on_change()
                    except Exception:
                        log.exception("cloud metadata: on_change failed")
                return
            if self.provider == AUTO and self.attempts == 1:
                self._done.set()  # nothing answered: do not hold start for a cloud we may not be in
            self._stop.wait(delay)
            delay = min(delay * 2, self.retry_max)

    def _log_once(self, key: str, level: int, message: str, **kv: object) -> None:
        first = key not in self._warned
        self._warned.add(key)
        log.log(level if first else logging.DEBUG, message, extra={"kv": kv})

    # -- per device --------------------------------------------------------------------------

    def identifiers(self, device: Device) -> DeviceIdentifiers:
        """What providers match a device by (MAC, PCI address and driver, RDMA device)."""
        host = device.host
        mac = device.attributes.get(D + "mac")
        pci_driver = None
        if host.pci_address:
            try:
                pci_driver = os.path.basename(
                    os.readlink(os.path.join(self.sysfs_root, "bus/pci/devices", host.pci_address, "driver"))
                )
            except OSError:
                pci_driver = None
        return DeviceIdentifiers(
            name=device.name,
            mac=mac if isinstance(mac, str) else host.permanent_mac,
            pci_address=host.pci_address,
            ifname=host.ifname,
            rdma_device=host.rdma_device,
            pci_driver=pci_driver,
        )

    def annotate(self, devices: Iterable[Device]) -> list[Device]:
        """``devices`` with the provider's attributes added (within the API limits); unchanged without metadata."""
        instance = self._instance
        if instance is None:
            return list(devices)
        out = []
        for device in devices:
            try:
                extra = instance.device_attributes(self.identifiers(device))
            except Exception as exc:  # noqa: BLE001 - one device's odd metadata must not break a scan
                if device.name not in self._failed_devices:
                    self._failed_devices.add(device.name)
                    log.warning("cloud attributes failed", extra={"kv": {"device": device.name, "error": str(exc)}})
                extra = {}
            if not extra:
                out.append(device)
                continue
            # Discovered attributes win on a (never expected) name clash: they describe the device itself.
            merged = {**extra, **device.attributes}
            out.append(replace(device, attributes=attrs.finalize(merged, device.name)))
        return out

    def device_config(self, device: Device) -> NetworkConfig | None:
        """The provider's network config for ``device`` (merged under the claim's at prepare), or None."""
        instance = self._instance
        if instance is None:
            return None
        try:
            return instance.device_config(self.identifiers(device))
        except Exception as exc:  # noqa: BLE001 - a provider bug must not fail the claim
            log.warning("cloud device config failed", extra={"kv": {"device": device.name, "error": str(exc)}})
            return None
