"""Which cloud this node runs on: the providers, and auto-detection in the Go driver's order.

``--cloud-provider auto`` probes GCE, AWS, Azure, OKE and Alibaba (the Go driver's order) and takes
the first that answers; ``none`` turns cloud attributes off; a provider name skips detection. The
probes run concurrently (each is a request or two with a short timeout), so a node outside any
cloud learns it within a few seconds instead of the Go driver's sequential 5 s per provider.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from driver.inventory.cloud import alibaba, aws, azure, gce, oke
from driver.inventory.cloud.base import CloudInstance
from driver.inventory.cloud.metadata import MetadataClient

AUTO, NONE = "auto", "none"


@dataclass(frozen=True)
class Provider:
    """A cloud provider: how to recognise it and how to fetch its instance metadata."""

    name: str
    probe: Callable[[MetadataClient], bool]
    fetch: Callable[[MetadataClient], CloudInstance]


PROVIDERS: tuple[Provider, ...] = tuple(Provider(m.NAME, m.probe, m.fetch) for m in (gce, aws, azure, oke, alibaba))
"""In detection order (the Go driver's: GCE, AWS, Azure, OKE, Alibaba)."""
BY_NAME = {p.name: p for p in PROVIDERS}
CHOICES = (AUTO, NONE, *BY_NAME)
"""Values of ``--cloud-provider``."""
GO_HINTS = {"GCE": "gce", "AWS": "aws", "AZURE": "azure", "OKE": "oke", "ALIBABA": "alibaba", "NONE": NONE, "": AUTO}
"""The Go driver's ``--cloud-provider-hint`` values -> ours (``CKS`` and ``webhook`` have no equivalent)."""


def parse_provider(value: str) -> str:
    """``--cloud-provider`` (or the Go driver's ``--cloud-provider-hint``) as one of :data:`CHOICES`.

    Raises ``ValueError`` naming the accepted values.
    """
    text = value.strip()
    if text in GO_HINTS:
        return GO_HINTS[text]
    if text.lower() in CHOICES:
        return text.lower()
    raise ValueError(
        f"--cloud-provider: {value!r} is not one of {', '.join(CHOICES)} "
        f"(or the Go driver's {', '.join(h for h in GO_HINTS if h)})"
    )


def detect(client: MetadataClient, providers: tuple[Provider, ...] = PROVIDERS) -> Provider | None:
    """The first provider (in order) whose probe succeeds, or None; all probes run at once."""
    with ThreadPoolExecutor(max_workers=len(providers), thread_name_prefix="cloud-probe") as pool:
        futures = [pool.submit(p.probe, client) for p in providers]
        for provider, future in zip(providers, futures, strict=True):
            try:
                if future.result():
                    return provider
            except Exception:  # noqa: BLE001 - a probe that crashes says "not this cloud"
                continue
    return None


def effective_provider(provider: str, host_sysfs: bool, metadata_url: str | None) -> str:
    """``auto`` means ``none`` when discovery reads a sysfs fixture and no ``--cloud-metadata-url`` is
    given: the fixture is not this VM, so this VM's metadata would describe the wrong machine."""
    if provider == AUTO and not host_sysfs and not metadata_url:
        return NONE
    return provider
