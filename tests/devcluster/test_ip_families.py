"""The dev cluster's address plan per IP family (pure): IPv4 as before, IPv6-only and dual-stack
networks derived from the one /20, every config file naming the addresses of every family."""

from __future__ import annotations

import ipaddress
import json

import pytest
import yaml

from devcluster.__main__ import main
from devcluster.cluster.coredns import corefile
from devcluster.cluster.lifecycle import api_env
from devcluster.cluster.node_config import cni_conflist, kubelet_config, resolv_conf
from devcluster.cluster.node_layout import LayoutError, NodeLayout


def test_ipv4_is_the_default_and_unchanged() -> None:
    layout = NodeLayout(name="fam", cluster_cidr="10.88.0.0/20")
    node = layout.node(1)
    assert layout.ip_family == "ipv4" and layout.versions == (4,)
    assert (layout.gateways, node.ips, node.pod_subnets) == (["10.88.0.1"], ["10.88.0.11"], ["10.88.2.0/24"])
    assert node.rail_addresses(3) == ["172.16.3.2/24"] and layout.service_ranges == ["10.0.0.0/24"]


def test_ipv6_networks_come_from_a_ula_named_after_the_ipv4_range() -> None:
    layout = NodeLayout(name="fam", cluster_cidr="10.88.16.0/20", ip_family="ipv6")
    node = layout.node(1)
    assert layout.versions == (6,)
    assert layout.gateway == "fd0a:5810::1" and node.ip == "fd0a:5810::b"
    assert node.pod_subnet == "fd0a:5810:0:2::/64" and node.pod_gateway == "fd0a:5810:0:2::1"
    assert node.rail_addresses(3) == ["fd16:ac10:0:3::2/64"]
    assert layout.service_ranges == ["fd00:10::/112"]
    assert layout.ranges == [ipaddress.ip_network("fd0a:5810::/48")]  # what `up` checks the host's routes against
    # Another /20, another /48: two clusters never share an IPv6 range.
    other = NodeLayout(name="oth", cluster_cidr="10.88.32.0/20", ip_family="ipv6")
    assert not ipaddress.ip_network(other.node(0).pod_subnet).overlaps(ipaddress.ip_network(node.pod_subnet))


def test_dual_stack_lists_ipv4_first_in_every_config() -> None:
    layout = NodeLayout(name="fam", cluster_cidr="10.88.0.0/20", ip_family="dual")
    node = layout.node(0)
    assert node.ips == ["10.88.0.10", "fd0a:5800::a"] and node.ip == "10.88.0.10"
    assert node.rail_addresses(0) == ["172.16.0.1/24", "fd16:ac10::1/64"]
    assert [str(r) for r in layout.ranges] == ["10.88.0.0/20", "fd0a:5800::/48"]
    ranges = json.loads(cni_conflist(node))["plugins"][0]["ipam"]["ranges"]
    assert ranges == [
        [{"subnet": "10.88.1.0/24", "gateway": "10.88.1.1"}],
        [{"subnet": "fd0a:5800:0:1::/64", "gateway": "fd0a:5800:0:1::1"}],
    ]
    assert resolv_conf(node) == "nameserver 10.88.0.1\nnameserver fd0a:5800::1\n"
    kubelet = yaml.safe_load(kubelet_config(node))
    assert kubelet["clusterDNS"] == ["10.88.0.1", "fd0a:5800::1"] and kubelet["address"] == "::"
    assert "bind 10.88.0.1 fd0a:5800::1\n" in corefile(layout, 8181)


def test_an_ipv6_apiserver_address_is_bare_in_the_pods_environment() -> None:
    env = {e["name"]: e["value"] for e in api_env("https://[fd0a:5800::1]:6443")}
    assert env == {"KUBERNETES_SERVICE_HOST": "fd0a:5800::1", "KUBERNETES_SERVICE_PORT": "6443"}


def test_an_unknown_family_names_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(LayoutError, match="ip_family: 'ipv5' must be one of ipv4, ipv6, dual"):
        NodeLayout(ip_family="ipv5")
    with pytest.raises(SystemExit):
        main(["up", "--ip-family", "ipv5"])
    assert "--ip-family: invalid choice: 'ipv5'" in capsys.readouterr().err
