"""What NodePrepareResources / NodeUnprepareResources are about and answer, claim by claim.

The kubelet names claims by identity only (:class:`ClaimRef`); each gets its devices back
(:class:`PrepareResult`) or its own error (:class:`ClaimError`), never the whole call's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from driver.checkpoint.state import PreparedClaim


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepare/NodeUnprepare requests."""

    namespace: str
    name: str
    uid: str


@dataclass
class ResultDevice:
    """One device of a prepared claim, as returned to the kubelet."""

    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str] = field(default_factory=list)
    share_id: str | None = None


@dataclass
class PrepareResult:
    """Per-claim outcome: devices, or a non-empty error (then devices are ignored)."""

    devices: list[ResultDevice] = field(default_factory=list)
    error: str = ""


class ClaimError(Exception):
    """A claim cannot be prepared; the message is returned to the kubelet for that claim only."""


def result_of(record: PreparedClaim) -> PrepareResult:
    """The kubelet's answer for a prepared claim: one result per device, under its request."""
    return PrepareResult(
        devices=[ResultDevice(request_names=[d.request], pool=d.pool, device=d.device) for d in record.devices]
    )
