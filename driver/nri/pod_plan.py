"""The plan of a pod's NICs: one per NIC, from its prepared device to its record in the pod state.

:func:`nic_plan` makes the plan (:class:`~driver.nic_settings.setting.Nic`): the host's record of
the NIC, its name, MTU and MAC in the pod, what each setting records to undo itself; what can be
known before a move is checked against it (:func:`check_names_and_mtus`, each NIC's ifindex in the
pod: :func:`pod_indexes`). :func:`moved_device` is its write-ahead record, :func:`check_in_pod`
the check once it is in the pod, :func:`in_pod_state` the pod's state once it is configured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from driver.checkpoint.state import IN_POD, MOVING, DriverState, MovedDevice, PodNetState, PreparedClaim, PreparedDevice
from driver.claims.claim_build import sub_interface_kind
from driver.netlink import mtu_limits, sub_interfaces
from driver.netlink.kernel_features import MOVE_IFINDEX
from driver.netlink.link_identity import LinkIdentity
from driver.netlink.link_info import LinkInfo
from driver.netlink.nic_moves import LinkState, Move, PodLinkConfig, check_moved
from driver.netlink.rtnl import NetnsOpError, free_indexes
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused
from driver.nri.shares import SUB_INTERFACE

Netdev = tuple[PreparedClaim, PreparedDevice]
"""A pod's prepared device with a netdev, and its claim."""


def netdevs_of(state: DriverState, pod_uid: str) -> list[Netdev]:
    """The pod's prepared devices whose netdev moves (not a VF on vfio-pci), with their claims."""
    return pod_devices(state, pod_uid)[0]


def pod_devices(state: DriverState, pod_uid: str) -> tuple[list[Netdev], list[Netdev]]:
    """The pod's prepared devices whose netdev moves (:func:`netdevs_of`), and its VFs on vfio-pci
    (nothing moves), with their claims: the pod's claims looked up once."""
    pairs = [(c, d) for c in state.claims_for_pod(pod_uid) for d in c.devices]
    return [p for p in pairs if p[1].moves], [p for p in pairs if p[1].vfio]


def pod_link(device: PreparedDevice, host: LinkState) -> PodLinkConfig:
    """The NIC's name, MTU and MAC in the pod (the settings plan the rest)."""
    iface = device.config.interface
    if iface is None:
        return PodLinkConfig(ifname=host.ifname, mac=device.config.pod_mac)
    return PodLinkConfig(ifname=iface.name or host.ifname, mtu=iface.mtu, mac=device.config.pod_mac)


def nic_plan(claim: PreparedClaim, device: PreparedDevice, host: LinkState, lease: str | None = None) -> Nic:
    """The plan of one NIC; a sub-interface is planned against none of the NIC's host state (its
    addresses, routes and rules stay with the NIC on the host): what it keeps when its claim sets
    no address is its ``lease`` from the NIC's pool, as a moved NIC keeps its host addresses."""
    if not device.sub_interface:
        return Nic(claim, device, host, pod_link(device, host))
    parent = LinkState(ifname=host.ifname, mtu=host.mtu, mac="", addresses=[lease] if lease else [])
    nic = Nic(claim, device, parent, pod_link(device, parent))
    kind = sub_interface_kind(device.config)
    nic.records[SUB_INTERFACE] = {"kind": kind, "parent": host.ifname, "parentIndex": host.index}
    if lease:
        nic.records[SUB_INTERFACE][sub_interfaces.LEASE] = lease
    return nic


def for_setting(setting: NicSetting, nics: Sequence[Nic]) -> list[Nic]:
    """The NICs ``setting`` works on: sub-interfaces only when it handles them."""
    return [nic for nic in nics if setting.sub_interfaces or not nic.sub_interface]


def check_names_and_mtus(nics: Sequence[Nic], pod_names: set[str], sysfs_root: str) -> None:
    """Refuse a name the pod already has or that two of its NICs (of any of its claims) would
    get, and an MTU the NIC (or a VF's PF) cannot take: the kernel refuses them only once the
    NIC is in the pod."""
    names: dict[str, str] = {}
    for nic in nics:
        name = nic.pod.ifname
        if name in pod_names:
            reason = f"the pod already has an interface {name!r}; set interface.name to another name"
            raise SettingRefused(nic.name, "name", reason)
        if name in names:
            reason = f"{name!r} is also the name of device {names[name]} of this pod (another claim)"
            raise SettingRefused(nic.name, "name", reason)
        names[name] = nic.name
    for nic in nics:
        if nic.pod.mtu is not None:
            pf = mtu_limits.pf_mtu(nic.host.ifname, sysfs_root)
            problem = mtu_limits.problem(nic.pod.mtu, nic.host.min_mtu, nic.host.max_mtu, pf)
            if problem:
                raise SettingRefused(nic.name, "mtu", problem)


def pod_indexes(host: HostNetns, pod: PodNetns, nics: Sequence[Nic], links: Mapping[int, str]) -> list[int]:
    """Each NIC's ifindex in the pod (``links``: the pod's, index -> name), distinct: a moved NIC
    keeps its host one when free there (a kernel before 5.17 cannot give it another: then a taken
    one refuses the pod); a sub-interface gets one free in the pod *and* on the host, because
    kernels before the 2025 rtnetlink change (6.1 among them) look the index of a link created into
    another namespace up in the namespace the request comes from, where its parent is (EEXIST)."""
    taken = set(links)
    if not host.kernel.has(MOVE_IFINDEX):
        for nic in nics:
            if not nic.sub_interface and nic.host.index in taken:
                reason = (
                    f"kernel {host.kernel.release} cannot give a NIC another ifindex in a pod (IFLA_NEW_IFINDEX, "
                    f"Linux 5.17): it keeps {nic.host.index}, which the pod's {links[nic.host.index]} has"
                )
                raise SettingRefused(nic.name, "move", reason)
    indexes = free_indexes(pod.rtnl, [0 if nic.sub_interface else nic.host.index or 0 for nic in nics], taken)
    subs = [i for i, nic in enumerate(nics) if nic.sub_interface]
    if subs:
        others = taken | {index for i, index in enumerate(indexes) if i not in subs}
        picked = free_indexes(pod.rtnl, [indexes[i] for i in subs], others, also=host.rtnl())
        for i, index in zip(subs, picked, strict=True):
            indexes[i] = index
    return indexes


def moved_device(nic: Nic) -> MovedDevice:
    """The write-ahead record of one NIC about to move: how to find it and what undoes the pod's settings."""
    snapshot = nic.device.snapshot.host
    return MovedDevice(
        device=nic.name,
        host_ifname=nic.host.ifname,
        pod_ifname=nic.pod.ifname,
        permanent_mac=snapshot.permanent_mac or nic.host.permanent_mac,
        pci_address=snapshot.pci_address or nic.host.pci_address,
        host_mtu=nic.host.mtu,
        host_mac=nic.host.mac,
        pod_mac=nic.pod.mac or nic.host.mac,
        step=MOVING,
        host_index=nic.host.index,
        pod_index=nic.pod_index,
        identity=(nic.host.identity or LinkIdentity()).to_dict(),
        records=dict(nic.records),
    )


def check_in_pod(moves: list[Move], nics: Sequence[Nic], found: list[LinkInfo | None]) -> dict[str, LinkInfo]:
    """Each NIC as the pod sees it (``found``, at the moves' pod ifindexes; :func:`check_moved`: a moved
    NIC by its identity), a sub-interface of the kind it was made as; sets ``nic.link``."""
    identities = {nic.name: nic.host.identity or LinkIdentity() for nic in nics if not nic.sub_interface}
    links = check_moved(moves, identities, found)
    for nic in nics:
        nic.link = links[nic.name]
        if nic.sub_interface and nic.link.kind != nic.records[SUB_INTERFACE]["kind"]:
            raise NetnsOpError(nic.name, "verify", f"{nic.link.ifname} in the pod is not the sub-interface")
    return links


def in_pod_state(state: PodNetState, nics: Sequence[Nic], links: dict[str, LinkInfo]) -> PodNetState:
    """The pod's state once its NICs are configured: each ``in-pod`` with the records the pod side added."""
    by_name = {nic.name: nic for nic in nics}
    devices = []
    for m in state.devices:
        records = dict(by_name[m.device].records)
        link = links[m.device]
        devices.append(
            replace(
                m,
                step=IN_POD,
                records=records,
                # The pod's view of a veth's peer, now that it is in the pod: a link the pod makes
                # itself cannot have its peer outside the pod.
                identity=LinkIdentity.of(link, in_pod=True).to_dict(),
                # A sub-interface's MAC (the kernel's when the claim set none) finds it again.
                pod_mac=link.mac if SUB_INTERFACE in records else m.pod_mac,
            )
        )
    return replace(state, devices=devices)
