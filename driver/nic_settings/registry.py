"""The NIC settings the driver applies, in the order the kernel needs them (see :mod:`.setting`).

On the way in each moment runs the settings in this order, on the way back in reverse: the RDMA
device follows its netdev first; an SR-IOV VF's settings are set through its PF; ethtool features
are set before the NIC is up; eBPF programs come off and the VRF exists before the configuration
batch, in which the NIC is enslaved to its VRF before its addresses, then comes up, then gets its
routes, neighbors and rules; sysctls are written once it is up, the DHCP lease taken once it is
configured.

A new setting is a module of this package with one :class:`~.setting.NicSetting` and one entry here.
"""

from __future__ import annotations

from driver.nic_settings import (
    addresses,
    dhcp,
    ebpf,
    ethtool,
    neighbors,
    offload_sizes,
    rdma,
    rules,
    sriov_vf,
    sysctls,
    vrf,
)
from driver.nic_settings.setting import NicSetting

SETTINGS: tuple[NicSetting, ...] = (
    rdma.RdmaDevice(),
    sriov_vf.SriovVf(),
    ethtool.EthtoolSetting(),
    offload_sizes.OffloadSizes(),
    ebpf.Ebpf(),
    vrf.Vrf(),
    addresses.Addresses(),
    neighbors.Neighbors(),
    rules.Rules(),
    sysctls.Sysctls(),
    dhcp.Dhcp(),
)
