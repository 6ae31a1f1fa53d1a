"""The cloud provider's per-NIC config merged under the claim's (the Go driver's MergeNetworkConfig),
at prepare (real checkpoint, fake apiserver) and as the NRI hooks turn it into pod link config."""

from __future__ import annotations

import socket
from pathlib import Path

from driver.api.v1alpha1.merge import merge_under_cloud
from driver.api.v1alpha1.network_config import EthtoolConfig, InterfaceConfig, NetworkConfig, RouteConfig, RuleConfig
from driver.checkpoint.state import PreparedDevice
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.prepare import Preparer
from driver.dra.protocol import ClaimRef
from driver.kube.client import KubeClient
from driver.model.device import Device
from driver.netlink.nic_moves import LinkState
from driver.netlink.rtnl import Route
from driver.nic_settings.addresses import pod_addresses
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from tests.claims.test_prepare import NODE, inventory

AZURE = NetworkConfig(
    routes=(RouteConfig("0.0.0.0/0", "10.225.4.1", table=101),),
    rules=(RuleConfig(source="10.225.4.0/24", table=101),),
)


def test_no_cloud_config_is_the_claims() -> None:
    claim = NetworkConfig(interface=InterfaceConfig(mtu=9000))
    assert merge_under_cloud(None, claim) is claim


def test_claim_wins_scalars_lists_append_and_dedupe() -> None:
    cloud = NetworkConfig(
        interface=InterfaceConfig(name="eth9", mtu=1500, addresses=("10.0.0.5/24", "10.0.0.6/24")),
        routes=(RouteConfig("0.0.0.0/0", "10.0.0.1", table=101), RouteConfig("10.9.0.0/16", "10.0.0.1")),
        rules=(RuleConfig(source="10.0.0.0/24", table=101),),
        ethtool=EthtoolConfig(features={"tso": True, "gro": True}),
    )
    claim = NetworkConfig(
        interface=InterfaceConfig(mtu=9000, addresses=("10.0.0.6/24", "10.0.0.7/24")),
        routes=(RouteConfig("10.9.0.0/16", "10.0.0.254"), RouteConfig("0.0.0.0/0", "10.0.0.254")),
        ethtool=EthtoolConfig(features={"tso": False}),
    )
    out = merge_under_cloud(cloud, claim)
    assert out.interface == InterfaceConfig(
        name="eth9", mtu=9000, addresses=("10.0.0.5/24", "10.0.0.6/24", "10.0.0.7/24")
    )
    # (destination, table): the claim's 10.9/16 replaces the cloud's; both default routes stay (tables 101, main).
    assert out.routes == (
        RouteConfig("0.0.0.0/0", "10.0.0.1", table=101),
        RouteConfig("10.9.0.0/16", "10.0.0.254"),
        RouteConfig("0.0.0.0/0", "10.0.0.254"),
    )
    assert out.rules == cloud.rules
    assert out.ethtool == EthtoolConfig(features={"tso": False, "gro": True})


def _host() -> LinkState:
    return LinkState(
        ifname="eth1",
        mtu=1500,
        mac="60:45:bd:a1:b2:d4",
        addresses=["10.225.4.9/24"],
        routes=[Route(dst="10.30.0.0/16", gateway="10.225.4.254", table=254, family=socket.AF_INET)],
    )


def _device(config: NetworkConfig, cloud: NetworkConfig | None) -> PreparedDevice:
    return PreparedDevice("nic", NODE, "eth1", Device("eth1"), merge_under_cloud(cloud, config), cloud)


def test_hooks_keep_host_routes_and_add_the_clouds_when_the_claim_sets_none() -> None:
    device = _device(NetworkConfig(), AZURE)
    addresses, routes = pod_addresses(device.config, device.cloud_config, _host())
    assert addresses == ["10.225.4.9/24"]
    assert [(r.dst, r.gateway, r.table) for r in routes] == [
        ("10.30.0.0/16", "10.225.4.254", 254),
        ("0.0.0.0/0", "10.225.4.1", 101),
    ]


def test_hooks_use_only_configured_routes_when_the_claim_sets_some() -> None:
    claim = NetworkConfig(routes=(RouteConfig("10.40.0.0/16", "10.225.4.254"),))
    device = _device(claim, AZURE)
    _, routes = pod_addresses(device.config, device.cloud_config, _host())
    assert [(r.dst, r.table) for r in routes] == [("0.0.0.0/0", 101), ("10.40.0.0/16", 254)]


async def test_prepare_stores_the_merged_config_and_the_clouds(tmp_path: Path) -> None:
    with FakeAPIServer() as api:
        kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        asked: list[str] = []

        def cloud_config(device: Device) -> NetworkConfig | None:
            asked.append(device.name)
            return AZURE if device.name == "pci-0000-8a-00-0" else None

        preparer = Preparer(
            kube,
            CheckpointStore(tmp_path / "state"),
            ClaimBuilder(inventory, "dra.net", NODE, cloud_config=cloud_config),
        )
        configs = [{"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": {"interface": {"mtu": 4000}}}}]
        api.add_claim(
            make_claim(
                "ns",
                "c1",
                "uid-1",
                [result("pci-0000-8a-00-0", NODE, "nic"), result("pci-0000-8a-00-1", NODE, "nic")],
                configs=configs,
                pods=["p"],
            )
        )
        out = await preparer.prepare([ClaimRef("ns", "c1", "uid-1")])
    assert out["uid-1"].error == ""
    assert asked == ["pci-0000-8a-00-0", "pci-0000-8a-00-1"]
    stored = CheckpointStore(tmp_path / "state").read(lambda s: s.claims["uid-1"])
    first, second = stored.devices
    assert first.cloud_config == AZURE
    assert first.config == NetworkConfig(interface=InterfaceConfig(mtu=4000), routes=AZURE.routes, rules=AZURE.rules)
    assert second.cloud_config is None and second.config == NetworkConfig(interface=InterfaceConfig(mtu=4000))


def test_a_claim_vrf_leaves_the_cloud_rules_out() -> None:
    from driver.api.v1alpha1.network_config import VrfConfig

    claim = NetworkConfig(interface=InterfaceConfig(vrf=VrfConfig("vrf-a", 10)))
    out = merge_under_cloud(AZURE, claim)
    assert out.rules is None and out.routes == AZURE.routes
