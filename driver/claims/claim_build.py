"""The record of one claim: which allocated devices are ours, and the config each one gets.

A ResourceClaim becomes a :class:`~driver.checkpoint.state.PreparedClaim` when it is the claim the
kubelet asked for (same UID), allocated, and every result of our driver names a device of this
node's pool and inventory. Each device's config is decoded, validated and merged (the cloud
provider's under the claim's, a ``profile`` under both), then checked against what the NIC can
do (its MTU limits, and each NIC setting's own check: ethtool features, offload sizes, DHCP) and
against the claim's other NICs (names, addresses, NUMA pinning). Anything wrong is a
:class:`ClaimError` for this claim only: refused at prepare, rather than fail every start of the pod.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from driver.api.v1alpha1.conflicts import conflict_errors, interface_conflicts
from driver.api.v1alpha1.decode import MAX_POD_REQUESTS, configure_requests
from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.merge import configs_for_request, merge_under_cloud
from driver.api.v1alpha1.network_config import VFIO_PCI, NetworkConfig
from driver.checkpoint.state import PreparedClaim, PreparedDevice
from driver.claims.numa_pinning import device_numa_node, numa_pin_node
from driver.claims.profile import ProfileError, ProfileResolver
from driver.dra.protocol import ClaimRef
from driver.inventory.vfio_binding import VfioBinder
from driver.model.device import Device
from driver.netlink import mtu_limits
from driver.netlink.channel import netlink_socket
from driver.netlink.kernel_features import link_kind_supported
from driver.netlink.rtnl import Rtnl
from driver.netlink.sub_interfaces import KINDS, MACVLAN
from driver.nic_settings.registry import SETTINGS
from driver.nic_settings.setting import NicSetting


class ClaimError(Exception):
    """A claim cannot be prepared; the message is returned to the kubelet for that claim only."""


def base_request(request: str) -> str:
    """The request name without a subrequest suffix (``"nic/sub"`` -> ``"nic"``)."""
    return request.split("/", 1)[0]


class ClaimBuilder:
    """Turns a ResourceClaim into the record prepare stores (no checkpoint, no API server)."""

    def __init__(
        self,
        devices: Callable[[], dict[str, Device]],
        driver_name: str,
        node_name: str,
        cloud_config: Callable[[Device], NetworkConfig | None] | None = None,
        profiles: ProfileResolver | None = None,
        sysfs_root: str = "/sys",
        settings: Sequence[NicSetting] = SETTINGS,
    ) -> None:
        """``devices`` returns the current inventory by device name (each device's config is decoded
        from the allocation's config entries once, here: :func:`~driver.api.v1alpha1.merge.configs_for_request`);
        ``cloud_config`` gives the cloud provider's config of a device, merged under the claim's
        (the Go driver's order); ``profiles`` resolves a config's ``profile``
        (``--profile-provider webhook``; None: refused); ``sysfs_root``: where a VF's PF is found;
        ``settings``: the NIC settings whose checks a device's config must pass."""
        self.devices = devices
        self.driver_name, self.node_name = driver_name, node_name
        self.cloud_config = cloud_config
        self.profiles = profiles
        self.sysfs_root = sysfs_root
        self.settings = tuple(settings)
        self.vfio = VfioBinder(sysfs_root)
        self._kinds: dict[str, tuple[bool, str]] = {}  # sub-interface kind -> whether this kernel has it

    def build(self, ref: ClaimRef, claim: dict[str, Any], inventory: dict[str, Device] | None = None) -> PreparedClaim:
        """The record of ``claim``: our allocated devices with their snapshots (from ``inventory``,
        default the current one) and decoded configs; :class:`ClaimError` when it cannot be prepared
        (then the profiles resolved for it are released again)."""
        profiled: list[tuple[Device, NetworkConfig]] = []
        links = mtu_limits.HostLinks()  # one netlink socket for the claim's NIC checks
        try:
            return self._build(ref, claim, inventory, profiled, links)
        except Exception:
            if profiled and self.profiles is not None:
                self.profiles.release_devices(ref.uid, profiled)
            raise
        finally:
            links.close()

    def _build(
        self,
        ref: ClaimRef,
        claim: dict[str, Any],
        inventory: dict[str, Device] | None,
        profiled: list[tuple[Device, NetworkConfig]],
        links: mtu_limits.HostLinks,
    ) -> PreparedClaim:
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise ClaimError(f"{where} was replaced: it has UID {uid}, the kubelet asked for {ref.uid}")
        status = claim.get("status") or {}
        allocation = status.get("allocation")
        if not allocation:
            raise ClaimError(f"{where} is not allocated (status.allocation is empty)")
        alloc_devices = allocation.get("devices") or {}
        configs = alloc_devices.get("config") or []
        inventory = self.devices() if inventory is None else inventory
        prepared: list[PreparedDevice] = []
        requests: list[str] = []  # each prepared device's request (with its subrequest)
        decoded: dict[str, NetworkConfig] = {}  # request -> its config: decoded once, not per device
        for index, result in enumerate(alloc_devices.get("results") or []):
            if result.get("driver") != self.driver_name:
                continue  # another driver's device in a mixed claim
            path = f"status.allocation.devices.results[{index}]"
            pool, name, request = result.get("pool"), result.get("device"), result.get("request") or ""
            if pool != self.node_name:
                raise ClaimError(f"{where}: {path}.pool is {pool!r}, not this node's pool {self.node_name!r}")
            device = inventory.get(name or "")
            if device is None:
                raise ClaimError(f"{where}: {path}.device {name!r} is not a device of this node")
            base = base_request(request)
            config = self._request_config(where, configs, request or base, decoded)
            cloud = self.cloud_config(device) if self.cloud_config is not None else None
            config = merge_under_cloud(cloud, config)
            config = self._with_profile(where, base, claim, device, config)
            if config.profile:
                profiled.append((device, config))
            share_id = _share_id(result)
            self._check_nic(f"{where}: config for request {base!r}: ", device, config, share_id is not None, links)
            shared = result.get("adminAccess") is True or share_id is not None
            prepared.append(
                PreparedDevice(
                    request=base,
                    pool=pool,
                    device=name,
                    snapshot=device,
                    config=config,
                    cloud_config=cloud,
                    shared=shared,
                    share_id=share_id,
                    consumed=_consumed(result),
                )
            )
            requests.append(request or base)
        pod_uids = [
            r["uid"]
            for r in status.get("reservedFor") or []
            if r.get("resource") == "pods" and r.get("apiGroup", "") in ("", None) and r.get("uid")
        ]
        _one_share_per_nic(where, prepared, requests)
        prepared = self._vfio_checked(where, prepared)
        nics = [(f"request {r!r} (device {d.device})", r, d.config) for r, d in zip(requests, prepared, strict=True)]
        errors = conflict_errors(
            interface_conflicts(nics), configs, self.driver_name, "status.allocation.devices.config"
        )
        if errors:
            raise ClaimError(f"{where}: {'; '.join(str(e) for e in errors)}")
        try:
            # numa.pin across NICs on several NUMA nodes can never be honoured: refuse it now,
            # as a per-claim error, rather than start a pod that silently runs unpinned.
            numa_pin_node(
                ((d.config, device_numa_node(d), d.device) for d in prepared),
                "status.allocation.devices.config: numa.pin",
            )
        except ConfigError as exc:
            raise ClaimError(f"{where}: {exc}") from None
        # Every device known now (also allocationMode All, the cloud provider's routes and rules).
        requests_needed = sum(configure_requests(d.config) for d in prepared if not d.shared)
        if requests_needed > MAX_POD_REQUESTS:
            raise ClaimError(
                f"{where}: status.allocation.devices.config: the claim's {len(prepared)} NIC(s) take "
                f"{requests_needed} netlink requests to configure (one per address, route, rule and neighbor, one per "
                f"NIC, one per VRF); a claim's NICs may take at most {MAX_POD_REQUESTS} (they are configured inside "
                "the NRI hook's 2-second budget)"
            )
        return PreparedClaim(uid=ref.uid, namespace=ref.namespace, name=ref.name, pod_uids=pod_uids, devices=prepared)

    def _request_config(
        self, where: str, configs: list[dict[str, Any]], request: str, decoded: dict[str, NetworkConfig]
    ) -> NetworkConfig:
        """The allocation's config of ``request`` (with its subrequest), decoded once per claim."""
        if request not in decoded:
            try:
                decoded[request] = configs_for_request(configs, request, self.driver_name)
            except Exception as exc:  # noqa: BLE001 - decoder errors name the field; pass them on per claim
                raise ClaimError(f"{where}: config for request {base_request(request)!r}: {exc}") from None
        return decoded[request]

    def _with_profile(
        self, where: str, request: str, claim: dict[str, Any], device: Device, config: NetworkConfig
    ) -> NetworkConfig:
        """``config`` with its ``profile`` resolved and merged under it; a failure is the claim's error."""
        if not config.profile:
            return config
        problem = f"{where}: config for request {request!r}: "
        if self.profiles is None:
            raise ClaimError(
                problem + f"profile {config.profile!r}: no profile provider (--profile-provider=webhook --webhook-url)"
            )
        try:
            return self.profiles.resolve(claim, device, config)[0]
        except ProfileError as exc:
            raise ClaimError(problem + str(exc)) from None

    def _check_nic(
        self,
        problem: str,
        device: Device,
        config: NetworkConfig,
        share: bool = False,
        links: mtu_limits.HostLinks | None = None,
    ) -> None:
        """Refuse, at prepare, what the NIC cannot take (like the Go driver for ethtool), rather than
        fail at every start of the pod: for a sub-interface (a ``share`` of the NIC, or
        ``interface.type``) what a sub-interface cannot be, then an MTU outside the NIC driver's
        limits or above a VF's PF, then each setting's own check. Only devices whose config asks
        for something pay a system call."""
        if share or (config.interface and config.interface.type):
            self._check_sub_interface(problem, device, config)
        mtu = config.interface.mtu if config.interface else None
        if mtu is not None and device.host.ifname:
            found = mtu_limits.check_host_nic(device.host.ifname, mtu, self.sysfs_root, links)
            if found:
                raise ClaimError(problem + found)
        for setting in self.settings:
            problems = setting.prepare_problems(device, config)
            if problems:
                raise ClaimError(problem + "; ".join(problems))

    def _vfio_checked(self, where: str, prepared: list[PreparedDevice]) -> list[PreparedDevice]:
        """The claim's devices, its VFs for vfio-pci with the driver each goes back to; refused where
        a VF is on vfio-pci for a claim that wants its netdev, or cannot go to vfio-pci."""
        self._check_vfio_bound(where, prepared)
        return self._with_host_drivers(where, prepared) if any(d.vfio for d in prepared) else prepared

    def _with_host_drivers(self, where: str, prepared: list[PreparedDevice]) -> list[PreparedDevice]:
        """The claim's VFs for vfio-pci, each with the kernel driver it goes back to; refused when one
        is not a VF, is shared, or cannot go to vfio-pci alone (its IOMMU group, the driver)."""
        held = {d.snapshot.host.pci_address for d in prepared if d.snapshot.host.pci_address}
        out = []
        for d in prepared:
            if not d.vfio:
                out.append(d)
                continue
            problem = f"{where}: config for request {d.request!r}: sriov.driver: device {d.device}"
            pci = d.snapshot.host.pci_address
            if not pci or not d.snapshot.host.sriov_pf:
                raise ClaimError(f"{problem} is not an SR-IOV VF: only a VF goes to {VFIO_PCI} for a claim")
            if d.shared:
                raise ClaimError(f"{problem} is shared (adminAccess or a shareID): a VF on {VFIO_PCI} is one pod's")
            found = self.vfio.problems(pci, held)
            if found:
                raise ClaimError(f"{problem}: {'; '.join(found)}")
            driver = self.vfio.driver_of(pci)  # vfio-pci already (the admin's): it stays there after
            if driver is None:
                raise ClaimError(f"{problem}: VF {pci} has no driver to go back to")
            nodes = self.vfio.devices(pci).paths  # those this node's kernel has
            out.append(replace(d, host_driver=driver, vfio_nodes=nodes))
        return out

    def _check_vfio_bound(self, where: str, prepared: list[PreparedDevice]) -> None:
        """Refuse a VF on vfio-pci (an admin's) for a claim that wants its netdev: it has none."""
        for d in prepared:
            pci = d.snapshot.host.pci_address
            if d.vfio or not (pci and d.snapshot.host.sriov_pf) or self.vfio.driver_of(pci) != VFIO_PCI:
                continue
            raise ClaimError(
                f"{where}: config for request {d.request!r}: device {d.device} is a VF on {VFIO_PCI} (no "
                f"netdev): only a claim with sriov.driver {VFIO_PCI} takes it; select on "
                '!has(device.attributes["dra.net"].pciDriver) for a netdev'
            )

    def _check_sub_interface(self, problem: str, device: Device, config: NetworkConfig) -> None:
        """Refuse a sub-interface this node cannot make: its kind unknown to the kernel (asked once
        per kind, by a request that creates nothing), or settings that would change the NIC itself."""
        _check_sub_interface(problem, device, config)
        kind = sub_interface_kind(config)
        if kind not in self._kinds:
            rtnl = Rtnl(netlink_socket(socket.NETLINK_ROUTE))
            try:
                self._kinds[kind] = link_kind_supported(rtnl, kind)
            finally:
                rtnl.close()
        supported, answer = self._kinds[kind]
        if not supported:
            raise ClaimError(
                problem + f"interface.type: this node's kernel cannot make {kind} links ({answer}); "
                f"{' or '.join(k for k in KINDS if k != kind)} may work"
            )


def _one_share_per_nic(where: str, prepared: list[PreparedDevice], requests: list[str]) -> None:
    """Refuse two shares of one NIC in one claim: its pods would need two sub-interfaces of the
    NIC each, and the pod state keeps one per device (the scheduler allows it: it is capacity)."""
    seen: dict[str, str] = {}
    for d, request in zip(prepared, requests, strict=True):
        if d.share_id is None:
            continue
        if d.device in seen:
            raise ClaimError(
                f"{where}: requests {seen[d.device]!r} and {request!r} both got a share of device {d.device}; "
                "one share of a NIC per claim (ask for more of its capacity in one request instead)"
            )
        seen[d.device] = request


def _share_id(result: dict[str, Any]) -> str | None:
    """The allocation's ``shareID`` of a device allocated many times (consumable capacity), or None."""
    share = result.get("shareID")
    return share if isinstance(share, str) and share else None


def _consumed(result: dict[str, Any]) -> dict[str, str]:
    """The allocation's ``consumedCapacity`` of a device (capacity name -> quantity), as written."""
    raw = result.get("consumedCapacity")
    return {str(k): str(v) for k, v in raw.items() if isinstance(v, str)} if isinstance(raw, dict) else {}


def sub_interface_kind(config: NetworkConfig) -> str:
    """The link kind of a device's sub-interface: the claim's ``interface.type``, else macvlan."""
    return (config.interface.type if config.interface else None) or MACVLAN


def _check_sub_interface(problem: str, device: Device, config: NetworkConfig) -> None:
    """Refuse what a sub-interface of a NIC cannot take: settings that would change the NIC itself,
    which the host (and other pods sharing it) keep using."""
    if not device.host.ifname:
        raise ClaimError(problem + f"device {device.name} has no netdev to make a sub-interface of")
    iface = config.interface
    fields = [
        name
        for name, asked in (
            ("ethtool", config.ethtool is not None),
            ("interface.gsoMaxSize/groMaxSize", bool(iface and iface.offload_sizes)),
            ("interface.disableEbpfPrograms", bool(iface and iface.disable_ebpf_programs)),
            # An ipvlan link has its parent's MAC: the kernel refuses another.
            (
                "interface.hardwareAddr with interface.type ipvlan",
                bool(iface and iface.type == "ipvlan" and iface.hardware_addr),
            ),
        )
        if asked
    ]
    if fields:
        raise ClaimError(
            problem + f"{', '.join(fields)}: device {device.name} gets a sub-interface in the pod; "
            "these settings would change the NIC itself, which stays on the host"
        )
