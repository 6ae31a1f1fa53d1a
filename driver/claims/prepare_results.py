"""What a claim's preparation ends in: its devices for the kubelet (:func:`result_of`), or its own
error (:class:`ClaimError`), never the whole call's.
"""

from __future__ import annotations

from driver.checkpoint.state import PreparedClaim
from driver.dra.protocol import PrepareResult, ResultDevice


class ClaimError(Exception):
    """A claim cannot be prepared; the message is returned to the kubelet for that claim only."""


def result_of(record: PreparedClaim) -> PrepareResult:
    """The kubelet's answer for a prepared claim: one result per device, under its request."""
    return PrepareResult(
        devices=[ResultDevice(request_names=[d.request], pool=d.pool, device=d.device) for d in record.devices]
    )
