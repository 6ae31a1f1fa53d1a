"""Shared NICs (``--sharing-filter``): which NICs many claims may hold at once, and what they offer.

A NIC the admin's sharing filter selects (CEL in the syntax of ``--filter``: over ``device`` or
dranet's ``attributes``) is published with ``allowMultipleAllocations: true`` and two consumable
capacities the scheduler counts (Kubernetes' consumable capacity, ``DRAConsumableCapacity``):

- ``dra.net/bandwidth``: the link rate (``dra.net/rateGbps``) in bits per second; a claim asks for
  a share in steps of 1% of it (``capacity.requests``), and a claim that asks nothing takes it all,
  so claims written for whole NICs never get a partly used one;
- ``dra.net/interfaces``: how many sub-interfaces it carries (``--sharing-max-interfaces``); each
  allocation takes one.

Every allocation of a shared NIC becomes a sub-interface of it in the pod; the NIC itself stays
on the host. A NIC without a known link rate offers only the interfaces bound. Its attributes are
those of any NIC (``rdma``, ``numaNode``, ``pciBusID``...), so the same selectors find it.
"""

from __future__ import annotations

from dataclasses import replace

from driver.config import DRIVER_NAME
from driver.inventory.attributes import capped
from driver.inventory.device_filter import DeviceFilter, FilterError
from driver.model.device import ATTRIBUTE_DOMAIN, MAX_ATTRIBUTES_PER_DEVICE, Device, ShareCapacity

RATE_ATTRIBUTE = f"{ATTRIBUTE_DOMAIN}/rateGbps"
BANDWIDTH_STEPS = 100
"""A share of a NIC's bandwidth is a whole number of 1% steps of its link rate."""
CAPACITIES = 2
"""Capacities a shared NIC publishes: the API caps attributes and capacities together at 32."""


def share_of(device: Device, max_interfaces: int) -> ShareCapacity:
    """What ``device`` offers when shared: its link rate as bandwidth, the sub-interface bound."""
    rate = device.attributes.get(RATE_ATTRIBUTE)
    gbps = rate if isinstance(rate, int) and not isinstance(rate, bool) and rate > 0 else 0
    bandwidth = gbps * 1_000_000_000
    return ShareCapacity(bandwidth=bandwidth, step=bandwidth // BANDWIDTH_STEPS, interfaces=max_interfaces)


class Sharing:
    """The compiled sharing filter; :meth:`apply` marks the devices it selects as shared.

    ``expression`` empty: no NIC is shared. :class:`~driver.inventory.device_filter.FilterError`
    names ``--sharing-filter`` for an expression that does not compile.
    """

    def __init__(self, expression: str, max_interfaces: int, driver_name: str = DRIVER_NAME) -> None:
        if max_interfaces < 1:
            raise FilterError(f"--sharing-max-interfaces: {max_interfaces} is below 1")
        self.filter = DeviceFilter(expression, driver_name, flag="--sharing-filter")
        self.max_interfaces = max_interfaces

    @property
    def enabled(self) -> bool:
        """Whether any NIC may be shared (a non-empty expression)."""
        return bool(self.filter.expression)

    def apply(self, devices: list[Device]) -> list[Device]:
        """``devices``, those the filter selects (with a netdev: a sub-interface needs a parent) shared."""
        if not self.enabled:
            return devices
        return [self._shared(d) if d.host.ifname and self.filter.keep(d, missing=False) else d for d in devices]

    def _shared(self, device: Device) -> Device:
        attributes = capped(device.attributes, MAX_ATTRIBUTES_PER_DEVICE - CAPACITIES, device.name)
        return replace(device, attributes=attributes, share=share_of(device, self.max_interfaces))
