"""Unit tests of the container environment and NUMA cpuset the NRI hooks add to containers."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.merge import configs_for_request
from driver.api.v1alpha1.network_config import NetworkConfig, NumaConfig, RdmaConfig
from driver.checkpoint.state import PreparedDevice
from driver.claims.container_settings import container_env, interfaces_env, roce_gid_index, settings_for_container
from driver.claims.numa_pinning import cpuset_for, format_cpulist, numa_pin_node, parse_cpulist
from driver.model.device import Device, HostFacts
from tests.support.claims import allocation_config

NONE = NetworkConfig()


def test_container_env_exact_match_and_opt_out():
    env = container_env([(NONE, "mlx5_1"), (NONE, "mlx5_0"), (NONE, None)])
    assert env == {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "DRANET_RDMA_DEVICES": "mlx5_0,mlx5_1"}
    assert container_env([(NetworkConfig(rdma=RdmaConfig(inject_env=False)), "mlx5_0")]) == {}
    assert container_env([(NONE, None)]) == {}


def test_numa_pin_node():
    pin = NetworkConfig(numa=NumaConfig(pin=True))
    assert numa_pin_node([(NONE, 0, "a"), (NONE, 1, "b")]) is None  # not asked for
    assert numa_pin_node([(pin, 1, "a"), (NONE, 1, "b")]) == 1
    with pytest.raises(ConfigError, match=r"span several \(node 0: a; node 1: b\)"):
        numa_pin_node([(pin, 0, "a"), (pin, 1, "b")])
    with pytest.raises(ConfigError, match="NUMA node of a is unknown"):
        numa_pin_node([(pin, -1, "a")])


def test_cpuset_for_reads_the_node_cpulist(tmp_path: Path):
    node = tmp_path / "devices/system/node/node1"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("24-47,72-95\n")
    plan = cpuset_for(1, str(tmp_path))
    assert (plan.cpus, plan.mems, plan.numa_node) == ("24-47,72-95", "1", 1)
    with pytest.raises(FileNotFoundError):
        cpuset_for(5, str(tmp_path))
    # Only ever narrowed: the kubelet's cpuset intersected with the node's CPUs.
    assert cpuset_for(1, str(tmp_path), requested="0-95").cpus == "24-47,72-95"
    assert cpuset_for(1, str(tmp_path), requested="20-30,80").cpus == "24-30,80"
    with pytest.raises(ConfigError, match="outside NUMA node 1"):
        cpuset_for(1, str(tmp_path), requested="0-3")


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert format_cpulist({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert format_cpulist(parse_cpulist("")) == ""


def test_prepare_decoder_output_is_what_the_helpers_read():
    configs = [
        allocation_config({"rdma": {"injectEnv": False}}, source="FromClass"),
        allocation_config({"numa": {"pin": True}, "interface": {"mtu": 9000}}, requests=["nic"]),
    ]
    config = configs_for_request(configs, "nic/fast", "dra.net")
    assert config.numa_pin and not config.rdma_env_enabled and config.interface.mtu == 9000
    assert container_env([(config, "mlx5_0")]) == {}
    assert numa_pin_node([(config, 1, "nic-a")]) == 1
    # Several parameter objects for one request are merged in order.
    two = [allocation_config({"interface": {"mtu": 1500}}), allocation_config({"interface": {"mtu": 4000}})]
    assert configs_for_request(two, "nic", "dra.net").interface.mtu == 4000
    with pytest.raises(ConfigError) as info:
        configs_for_request([allocation_config({"interface": {"mtu": 1}})], "nic", "dra.net")
    assert info.value.path == "status.allocation.devices.config[0].opaque.parameters.interface.mtu"


def _prepared(name, numa, rdma, config):
    attrs = {"dra.net/numaNode": numa} if numa is not None else {}
    return PreparedDevice("nic", "node-a", name, Device(name, attrs, HostFacts(rdma_device=rdma)), config)


def test_container_settings_env_and_cpuset(tmp_path: Path):
    for n, cpus in ((0, "0-47"), (1, "48-95")):
        d = tmp_path / f"devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus)
    pin = configs_for_request([allocation_config({"numa": {"pin": True}})], "nic", "dra.net")
    devs = [_prepared("a", 1, "mlx5_4", pin), _prepared("b", 1, "mlx5_5", pin)]
    out = settings_for_container(devs, str(tmp_path), requested_cpus="0-95")
    assert out.env == {"NCCL_IB_HCA": "=mlx5_4,mlx5_5", "DRANET_RDMA_DEVICES": "mlx5_4,mlx5_5"}
    assert (out.cpuset.cpus, out.cpuset.mems, out.skipped_pin) == ("48-95", "1", None)
    # Exclusive CPUs on the other node: not pinned, with the reason.
    out = settings_for_container(devs, str(tmp_path), requested_cpus="2-3")
    assert out.cpuset is None and "outside NUMA node 1" in out.skipped_pin
    # Spanning nodes: not pinned, reason names the nodes; env still injected.
    out = settings_for_container([_prepared("a", 0, "mlx5_0", pin), _prepared("b", 1, "mlx5_5", pin)], str(tmp_path))
    assert out.cpuset is None and "node 0: a; node 1: b" in out.skipped_pin and out.env
    # No pin asked: no cpuset, no complaint.
    out = settings_for_container([_prepared("a", 0, None, NetworkConfig())], str(tmp_path))
    assert out == type(out)()


def test_interfaces_env_names_the_pod_side_interfaces_sorted():
    renamed = configs_for_request([allocation_config({"interface": {"name": "net1"}})], "nic", "dra.net")

    def nic(name: str, ifname: str | None, config: NetworkConfig) -> PreparedDevice:
        return PreparedDevice("nic", "node-a", name, Device(name, {}, HostFacts(ifname=ifname)), config)

    devs = [nic("d", "ib3", NetworkConfig()), nic("a", "ib0", NetworkConfig()), nic("r", "ib5", renamed)]
    assert interfaces_env(devs) == {"DRANET_INTERFACES": "ib0,ib3,net1"}
    # An RDMA-only device (no netdev) adds nothing; no netdev at all: no variable.
    assert interfaces_env([nic("x", None, NetworkConfig())]) == {}
    env = settings_for_container(devs[:2]).env
    assert env == {"DRANET_INTERFACES": "ib0,ib3"}


def test_the_roce_gid_of_an_ipv4_or_an_ipv6_address(tmp_path: Path) -> None:
    """The GID table holds an IPv4 address as ``::ffff:a.b.c.d`` and an IPv6 one as itself; the
    RoCE v2 entry is the one NCCL needs (IPv6-only clusters too)."""
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs/types").mkdir(parents=True)
    (port / "link_layer").write_text("Ethernet\n")
    table = [
        ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
        ("0000:0000:0000:0000:0000:ffff:0a50:0001", "RoCE v2"),
        ("fd00:0080:0000:0000:0000:0000:0000:0005", "IB/RoCE v1"),
        ("fd00:0080:0000:0000:0000:0000:0000:0005", "RoCE v2"),
    ]
    for i, (gid, kind) in enumerate(table):
        (port / "gids" / str(i)).write_text(gid + "\n")
        (port / "gid_attrs/types" / str(i)).write_text(kind + "\n")
    assert roce_gid_index(str(tmp_path), "mlx5_0", "10.80.0.1") == 1
    assert roce_gid_index(str(tmp_path), "mlx5_0", "fd00:80::5") == 3
    assert roce_gid_index(str(tmp_path), "mlx5_0", "fd00:80::6") is None
    assert roce_gid_index(str(tmp_path), "mlx5_1", "10.80.0.1") is None
