"""An SR-IOV PF and its VFs published as partitions of one device (KEP-4815, shared counters).

A PF handed out whole takes its VFs with it (their netdevs and queues are its), and a VF handed
out while the PF is in another pod shares that pod's wire and the PF's settings. Each published
PF with VFs gets a counter set of its own in the pool (``sriov-<PF address>``), holding one counter,
``vfs``, of its VF count; each of its published VFs consumes 1 of it and the PF consumes all of it.
The scheduler then never allocates the PF together with any of its VFs, in either order or in one
claim, while its VFs go to as many claims as there are VFs. A PF the driver shares
(``--sharing-filter``: consumable capacity, many claims at once) gets no counter set, and so no
exclusion with its VFs; nor do the VFs of a PF that is not published (the node's uplink).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from driver.inventory.attributes import D
from driver.model.device import Device

COUNTER = "vfs"
"""The one counter of a PF's set: its VFs, all of which the PF whole takes."""


def counter_set_name(pf: str) -> str:
    """The counter set of the PF at PCI address ``pf`` (a DNS label: ``sriov-0000-3b-00-0``)."""
    return "sriov-" + pf.replace(":", "-").replace(".", "-")


def _pfs(devices: Sequence[Device]) -> dict[str, int]:
    """PCI address -> VF count, of the published, unshared PFs with VFs."""
    out = {}
    for d in devices:
        vfs = d.attributes.get(D + "sriovVfs")
        if isinstance(vfs, int) and vfs > 0 and d.share is None and d.host.pci_address:
            out[d.host.pci_address] = vfs
    return out


def with_counters(devices: Sequence[Device]) -> list[Device]:
    """``devices`` with what each PF and VF consumes from its PF's counter set (copies; the rest as they are)."""
    pfs = _pfs(devices)
    if not pfs:
        return list(devices)
    out = []
    for d in devices:
        pf, take = None, 0
        if d.host.pci_address in pfs and d.share is None:
            pf, take = d.host.pci_address, pfs[d.host.pci_address]
        elif d.host.sriov_pf in pfs and d.share is None:
            pf, take = d.host.sriov_pf, 1
        if pf is None:
            out.append(d)
        else:
            out.append(dataclasses.replace(d, counters={counter_set_name(pf): {COUNTER: take}}))
    return out


def counter_sets(devices: Sequence[Device]) -> list[dict[str, Any]]:
    """The v1 ``CounterSet`` of each PF that :func:`with_counters` drew on, among ``devices``."""
    used = {name for d in devices for name in (d.counters or {})}
    return [
        {"name": name, "counters": {COUNTER: {"value": str(vfs)}}}
        for pf, vfs in sorted(_pfs(devices).items())
        if (name := counter_set_name(pf)) in used
    ]
