"""A claim's ``ethtool`` section on a NIC: offload features and private flags by their ethtool names.

What ``ethtool -k/-K`` and ``--show-priv-flags/--set-priv-flags`` do: the claim config's names
are resolved against the NIC (:func:`plan`, :func:`check_features`: at prepare and again on the
host before the move, where the host's values are recorded), set and checked in the pod before
the NIC is configured (:func:`apply`), and the host's values set back once it is home, over the
ethtool generic-netlink client of :mod:`driver.netlink.ethtool_genl`. NICs without an ethtool
section cost nothing: no generic-netlink socket is opened for them.

Names: a kernel feature name (``tx-checksum-ip-generic``), or an ethtool CLI alias, short or
long (``tx``/``tx-checksumming``), which expands to the kernel names matching its pattern and
sets those the NIC can change, as the CLI does. Unknown names are errors. A feature the NIC
cannot change ("[fixed]") is an error when the request differs from its fixed value, and a
no-op when it does not (the NIC already is as asked; ``ethtool -K`` behaves the same).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.checkpoint.state import MovedDevice
from driver.model.device import Device
from driver.netlink.ethtool_genl import Ethtool, EthtoolError, FeatureState, describe, open_socket
from driver.netlink.rtnl import NetnsOpError
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused

# The ethtool CLI's legacy offload names (its off_flag_def table): short alias, long alias, and
# the glob of kernel feature names both stand for.
_OFF_FLAGS = """
rx      rx-checksumming                 rx-checksum
tx      tx-checksumming                 tx-checksum-*
sg      scatter-gather                  tx-scatter-gather*
tso     tcp-segmentation-offload        tx-tcp*-segmentation
ufo     udp-fragmentation-offload       tx-udp-fragmentation
gso     generic-segmentation-offload    tx-generic-segmentation
gro     generic-receive-offload         rx-gro
lro     large-receive-offload           rx-lro
rxvlan  rx-vlan-offload                 rx-vlan-hw-parse
txvlan  tx-vlan-offload                 tx-vlan-hw-insert
ntuple  ntuple-filters                  rx-ntuple-filter
rxhash  receive-hashing                 rx-hashing
"""
ALIASES: dict[str, str] = {
    alias: row[2] for row in map(str.split, _OFF_FLAGS.strip().splitlines()) for alias in row[:2]
}


@dataclass
class EthtoolPlan:
    """Resolved settings for one NIC and the values to restore when it leaves the pod."""

    features: dict[str, bool] = field(default_factory=dict)  # kernel names only
    private_flags: dict[str, bool] = field(default_factory=dict)
    original_features: dict[str, bool] = field(default_factory=dict)  # "wanted" before the change
    original_private_flags: dict[str, bool] = field(default_factory=dict)

    def empty(self) -> bool:
        """Nothing to set (the NIC already is as asked, or nothing was asked)."""
        return not self.features and not self.private_flags


# -- resolving a claim config against a NIC -----------------------------------------------------
def resolve_features(
    ifname: str, requested: dict[str, bool], state: FeatureState, names: frozenset[str]
) -> tuple[dict[str, bool], list[str]]:
    """Claim-config feature names -> (kernel names to set, errors naming the device and feature).

    Features already at the requested value but fixed are dropped (nothing to do).
    """
    out: dict[str, bool] = {}
    errors: list[str] = []
    for name, on in requested.items():
        if name in names:
            targets = [name]
        elif name.lower() in ALIASES:
            targets = sorted(n for n in names if fnmatch.fnmatchcase(n, ALIASES[name.lower()]))
        else:
            errors.append(
                f"device {ifname}: ethtool feature {name!r} is unknown (neither a kernel feature name "
                "as `ethtool -k` shows it nor an ethtool alias such as tx, rx, sg, tso, gso, gro)"
            )
            continue
        changeable = [t for t in targets if t in state.changeable]
        if not changeable:
            # The CLI's rule: the NIC already as asked is fine; otherwise it cannot be changed.
            stuck = [t for t in targets if (t in state.active) != on]
            if stuck:
                errors.append(
                    f"device {ifname}: ethtool feature {name!r}"
                    + (f" ({', '.join(stuck)})" if stuck != [name] else "")
                    + f" is fixed {'off' if on else 'on'} on this NIC and cannot be turned "
                    f"{'on' if on else 'off'}"
                )
            continue
        for t in changeable:
            out[t] = on
    return out, errors


def resolve_private_flags(ifname: str, requested: dict[str, bool], available: dict[str, bool]) -> list[str]:
    """Errors for private flags the NIC does not have (names are driver-defined, exact match)."""
    return [
        f"device {ifname}: ethtool private flag {name!r} does not exist on this NIC (it has: "
        f"{', '.join(sorted(available)) or 'none'})"
        for name in requested
        if name not in available
    ]


def plan(
    eth: Ethtool, ifname: str, features: dict[str, bool] | None, private_flags: dict[str, bool] | None
) -> EthtoolPlan:
    """Resolve a claim's ``ethtool`` section against ``ifname`` and record what to restore.

    Run where the NIC is (the host, before the move). Raises :class:`EthtoolError` with every
    problem in one message.
    """
    result, errors = _plan(eth, ifname, features, private_flags)
    if errors:
        raise EthtoolError("; ".join(errors))
    return result


def _plan(
    eth: Ethtool, ifname: str, features: dict[str, bool] | None, private_flags: dict[str, bool] | None
) -> tuple[EthtoolPlan, list[str]]:
    result = EthtoolPlan()
    errors: list[str] = []
    try:
        if features:
            state = eth.features(ifname)
            result.features, errors = resolve_features(ifname, features, state, eth.feature_names(ifname))
            result.original_features = {n: n in state.wanted for n in result.features}
        if private_flags:
            try:
                available = eth.private_flags(ifname)
            except EthtoolError as exc:
                errors.append(f"{exc}: cannot set ethtool private flags {', '.join(sorted(private_flags))}")
            else:
                errors += resolve_private_flags(ifname, private_flags, available)
                result.private_flags = dict(private_flags)
                result.original_private_flags = {n: available[n] for n in private_flags if n in available}
    except EthtoolError as exc:  # e.g. no such device
        errors.append(str(exc))
    return result, errors


def apply(
    eth: Ethtool,
    device: str,
    ifname: str,
    features: dict[str, bool],
    private_flags: dict[str, bool],
    step: str = "ethtool",
) -> None:
    """Set kernel-name ``features`` and ``private_flags`` on ``ifname`` and check they took.

    Raises :class:`driver.netlink.rtnl.NetnsOpError` naming ``device``, ``step`` and the feature.
    """
    try:
        eth.set_features(ifname, features)
        eth.set_private_flags(ifname, private_flags)
        if features:
            # The kernel may keep a feature off when one it depends on is off (e.g. TSO without
            # checksumming); it accepts the request silently, so look.
            active = eth.features(ifname).active
            wrong = {n: on for n, on in features.items() if (n in active) != on}
            if wrong:
                raise EthtoolError(
                    f"device {ifname}: feature(s) {describe(wrong)} requested but the kernel "
                    "kept the old value (a feature they depend on is off?)"
                )
    except EthtoolError as exc:
        raise NetnsOpError(device, step, str(exc)) from exc


def check_features(
    ifname: str,
    features: dict[str, bool] | None,
    netns: str | None = None,
    private_flags: dict[str, bool] | None = None,
) -> list[str]:
    """Prepare-time check of a claim's ``ethtool`` section against the NIC; [] when it can apply.

    Unknown feature names, features fixed at another value and private flags the NIC does not
    have each give one message naming the device and the name (the Go driver checks feature
    names at prepare too). ``netns``: path of the namespace the NIC is in (default: this one).
    """
    if not features and not private_flags:
        return []
    try:
        eth = Ethtool(open_socket(netns))
    except OSError as exc:
        return [f"device {ifname}: cannot check ethtool settings: {exc}"]
    try:
        return _plan(eth, ifname, features, private_flags)[1]
    finally:
        eth.close()


def targets(requested: dict[str, bool], resolved: Iterable[str]) -> dict[str, bool]:
    """What :func:`plan` decided to set, from the claim's names and the kernel names they were
    resolved to (``resolved``: the features whose host values were recorded)."""
    names = set(resolved)
    out: dict[str, bool] = {}
    for name, on in requested.items():
        if name in names:
            out[name] = on
        elif name.lower() in ALIASES:
            for t in sorted(n for n in names if fnmatch.fnmatchcase(n, ALIASES[name.lower()])):
                out[t] = on
    return out


class EthtoolSetting(NicSetting):
    """The claim's ``ethtool`` features and private flags."""

    name = "ethtool"

    def prepare_problems(self, device: Device, config: NetworkConfig) -> list[str]:
        eth = config.ethtool
        if eth is None or eth.empty:
            return []
        if not device.host.ifname:
            return [f"ethtool: device {device.name} has no netdev"]
        return check_features(device.host.ifname, eth.features, private_flags=eth.private_flags)

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        """Resolve each configured NIC's settings on the host and record the values they replace."""
        for nic in nics:
            cfg = nic.config.ethtool
            if cfg is None or cfg.empty:
                continue
            try:
                found = plan(host.ethtool(), nic.host.ifname, cfg.features, cfg.private_flags)
            except (EthtoolError, OSError) as exc:
                raise SettingRefused(nic.name, "ethtool", str(exc)) from exc
            nic.records[self.name] = {
                "features": found.original_features,
                "private_flags": found.original_private_flags,
            }

    def in_pod(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        """Set each NIC's features and private flags (before it is up)."""
        todo = []
        for nic in nics:
            cfg, recorded = nic.config.ethtool, nic.records.get(self.name)
            if cfg is None or recorded is None:
                continue
            features = targets(cfg.features or {}, recorded["features"])
            if features or cfg.private_flags:
                todo.append((nic, features, dict(cfg.private_flags or {})))
        if not todo:
            return
        pod_eth = pod.ethtool()
        try:
            for nic, features, flags in todo:
                apply(pod_eth, nic.name, nic.pod.ifname, features, flags)
        finally:
            pod_eth.close()

    def after_return(self, nic: MovedDevice, host: HostNetns) -> None:
        """The host's values again (also right when the pod's namespace is gone)."""
        recorded = nic.records.get(self.name)
        if recorded and (recorded.get("features") or recorded.get("private_flags")):
            features, flags = recorded.get("features") or {}, recorded.get("private_flags") or {}
            apply(host.ethtool(), nic.device, nic.host_ifname, features, flags, step="restore-ethtool")
