"""A claim's ``ethtool`` section on a pod's NICs: resolved on the host before the move, set in the
pod netns before link-up, and the host values restored when the NIC comes back.

NICs without an ethtool section cost nothing: no generic-netlink socket is opened for them.
"""

from __future__ import annotations

from collections.abc import Iterable

from driver.api.v1alpha1.network_config import EthtoolConfig
from driver.netlink import ethtool, ethtool_genl
from driver.netlink.namespaces import Namespaces


class EthtoolPlanError(Exception):
    """A NIC cannot take its claim's ethtool settings; names the device and the reason."""

    def __init__(self, device: str, reason: str) -> None:
        super().__init__(f"device {device}: {reason}")
        self.device = device
        self.reason = reason


class PodEthtool:
    """ethtool for the NICs of the pods this hook thread handles (host socket opened once, lazily)."""

    def __init__(self, ns: Namespaces) -> None:
        self.ns = ns
        self._host: ethtool_genl.Ethtool | None = None

    def host(self) -> ethtool_genl.Ethtool:
        """The ethtool client in the host netns."""
        if self._host is None:
            self._host = ethtool_genl.Ethtool(self.ns.socket_in(self.ns.host_fd, ethtool_genl.NETLINK_GENERIC))
        return self._host

    def plans(self, nics: Iterable[tuple[str, str, EthtoolConfig | None]]) -> dict[str, ethtool.EthtoolPlan]:
        """``(device, host ifname, config)`` per NIC -> each configured NIC's plan, read on the host.

        Raises :class:`EthtoolPlanError` for the first NIC that cannot take its settings.
        """
        plans = {}
        for device, ifname, cfg in nics:
            if cfg is None or cfg.empty:
                continue
            try:
                plans[device] = ethtool.plan(self.host(), ifname, cfg.features, cfg.private_flags)
            except (ethtool_genl.EthtoolError, OSError) as exc:
                raise EthtoolPlanError(device, str(exc)) from exc
        return plans

    def apply_in_pod(self, pod_fd: int, planned: dict[str, tuple[str, ethtool.EthtoolPlan]]) -> None:
        """Set each NIC's planned features and private flags (``device -> (pod ifname, plan)``)."""
        todo = {dev: (name, p) for dev, (name, p) in planned.items() if not p.empty()}
        if not todo:
            return
        pod_eth = self.host().sibling(self.ns.socket_in(pod_fd, ethtool_genl.NETLINK_GENERIC))
        try:
            for dev, (name, p) in todo.items():
                ethtool.apply(pod_eth, dev, name, p.features, p.private_flags)
        finally:
            pod_eth.close()

    def restore_on_host(self, device: str, ifname: str, features: dict[str, bool], flags: dict[str, bool]) -> None:
        """Give a returned NIC its host values back (also right when the pod netns is gone)."""
        ethtool.apply(self.host(), device, ifname, features, flags, step="restore-ethtool")
