"""One NIC, one claim: new prepared claims checked against the devices stored claims already hold.

A NIC moves into one pod, it cannot be in two; only a device allocated shared (adminAccess or a
shareID) may be in several claims. Run inside the group commit, under the store's lock, so the
check sees every claim stored so far, including those of concurrent calls.
"""

from __future__ import annotations

from driver.checkpoint.state import DriverState, PreparedClaim
from driver.claims.prepare_results import ClaimError


def record_claims(state: DriverState, records: list[PreparedClaim]) -> list[PreparedClaim | ClaimError]:
    """Store new claims (under the store's lock: decided against every claim stored so far).

    A claim a concurrent call stored first keeps its original record. A claim that wants a device
    another stored claim holds is refused with the holder's name, unless one of the two holds
    it shared (adminAccess): a NIC moves into one pod, it cannot be in two.
    """
    holders: dict[tuple[str, str], PreparedClaim] = {
        (d.pool, d.device): c for c in state.claims.values() for d in c.devices if not d.shared
    }
    out: list[PreparedClaim | ClaimError] = []
    for record in records:
        existing = state.claims.get(record.uid)
        if existing is not None:
            out.append(existing)
            continue
        taken = [
            (d.device, holders[(d.pool, d.device)])
            for d in record.devices
            if not d.shared and (d.pool, d.device) in holders
        ]
        if taken:
            device, holder = taken[0]
            out.append(
                ClaimError(
                    f"ResourceClaim {record.namespace}/{record.name}: device {device} is already held by "
                    f"ResourceClaim {holder.namespace}/{holder.name} (uid {holder.uid}); a device can be in "
                    "one claim at a time unless allocated with adminAccess"
                )
            )
            continue
        state.claims[record.uid] = record
        holders.update({(d.pool, d.device): record for d in record.devices if not d.shared})
        out.append(record)
    return out
