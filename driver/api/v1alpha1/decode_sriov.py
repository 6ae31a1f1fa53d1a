"""Decoding of a config's ``sriov`` section: an SR-IOV VF's settings that its PF holds.

The fields and their ranges are the kernel's (``ip link set <pf> vf N ...``) and the SR-IOV CNI's
names for them (``vlan``, ``vlanQoS``, ``vlanProto``, ``spoofchk``, ``trust``, ``min_tx_rate``,
``max_tx_rate``, ``link_state``, ``mac``), in this API's camelCase; ``driver`` is the SR-IOV DRA driver's
``VfConfig.driver`` (``vfio-pci``: the VF goes to the pod on vfio-pci, for DPDK and KubeVirt).
Whether the NIC is a VF and whether its PF's driver has a setting are the node's to say (at
prepare, and the PF's answer at pod start).
"""

from __future__ import annotations

from typing import Any

from driver.api.v1alpha1.decode_interface import decode_mac
from driver.api.v1alpha1.fields import FieldError, FieldErrors, read_bool, read_int, read_object, read_str, shown
from driver.api.v1alpha1.network_config import VFIO_PCI, NetworkConfig, SriovConfig

SRIOV_FIELDS = [
    "vlan",
    "vlanQoS",
    "vlanProto",
    "spoofChk",
    "trust",
    "minTxRate",
    "maxTxRate",
    "linkState",
    "mac",
    "driver",
]
MAX_VLAN = 4094
"""802.1Q's last usable VLAN ID (4095 is reserved)."""
MAX_QOS = 7
VLAN_PROTOS = ("802.1Q", "802.1ad")
LINK_STATES = ("auto", "enable", "disable")
VF_DRIVERS = (VFIO_PCI,)
"""The drivers a claim may bind its VF to (absent: the VF's own kernel driver)."""
VF_SETTINGS = (
    "vlan",
    "vlan_qos",
    "vlan_proto",
    "spoof_chk",
    "trust",
    "min_tx_rate",
    "max_tx_rate",
    "link_state",
    "mac",
)
"""The fields of ``sriov`` set through the PF once the VF's netdev is in the pod."""
MAX_RATE = 2**32 - 1
"""Mbit/s: the kernel's rates are u32."""


def _choice(raw: Any, path: str, allowed: tuple[str, ...], errs: FieldErrors) -> str | None:
    value = read_str(raw, path, errs)
    if value is not None and value not in allowed:
        errs.add(path, f"{shown(value)} is not one of {', '.join(allowed)}")
        return None
    return value


def decode_sriov(raw: Any, path: str, errs: FieldErrors) -> SriovConfig | None:
    """The ``sriov`` object, or None after recording why not."""
    obj = read_object(raw, path, SRIOV_FIELDS, errs)
    if obj is None:
        return None
    config = SriovConfig(
        vlan=read_int(obj.get("vlan"), f"{path}.vlan", errs, 0, MAX_VLAN),
        vlan_qos=read_int(obj.get("vlanQoS"), f"{path}.vlanQoS", errs, 0, MAX_QOS),
        vlan_proto=_choice(obj.get("vlanProto"), f"{path}.vlanProto", VLAN_PROTOS, errs),
        spoof_chk=read_bool(obj.get("spoofChk"), f"{path}.spoofChk", errs),
        trust=read_bool(obj.get("trust"), f"{path}.trust", errs),
        min_tx_rate=read_int(obj.get("minTxRate"), f"{path}.minTxRate", errs, 0, MAX_RATE),
        max_tx_rate=read_int(obj.get("maxTxRate"), f"{path}.maxTxRate", errs, 0, MAX_RATE),
        link_state=_choice(obj.get("linkState"), f"{path}.linkState", LINK_STATES, errs),
        mac=decode_mac(obj.get("mac"), f"{path}.mac", errs),
        driver=_choice(obj.get("driver"), f"{path}.driver", VF_DRIVERS, errs),
    )
    return config


def sriov_combination_errors(config: SriovConfig, path: str) -> list[FieldError]:
    """Fields of ``sriov`` that are each valid but cannot go together; checked on each config and
    again on a request's merged config (one config may set the VLAN, another its QoS)."""
    out = []
    for name, key in (("vlan_qos", "vlanQoS"), ("vlan_proto", "vlanProto")):
        if getattr(config, name) not in (None, 0, "802.1Q") and not config.vlan:
            out.append(FieldError(f"{path}.{key}", "needs a vlan other than 0 (it is the VLAN's)"))
    low, high = config.min_tx_rate, config.max_tx_rate
    if low and high and low > high:
        out.append(FieldError(f"{path}.minTxRate", f"{low} Mbit/s is above maxTxRate ({high} Mbit/s)"))
    return out


def vfio_combination_errors(config: NetworkConfig, path: str) -> list[FieldError]:
    """What a VF on vfio-pci cannot take: it has no netdev in the pod, so nothing that configures
    one (the pod gets the VF's VFIO group; the PF's settings of the VF, ``sriov.vlan`` and the
    others, it takes: they are set through the PF at prepare)."""
    if not config.vfio:
        return []
    netdev_fields = [
        name
        for name, value in (
            ("interface", config.interface),
            ("routes", config.routes),
            ("rules", config.rules),
            ("neighbors", config.neighbors),
            ("ethtool", config.ethtool),
        )
        if value is not None
    ]
    if not netdev_fields:
        return []
    reason = (
        f"sriov.driver {VFIO_PCI} hands the VF to the pod through its VFIO group, without a netdev: "
        f"{', '.join(netdev_fields)} cannot apply"
    )
    return [FieldError(f"{path}.sriov.driver", reason)]
