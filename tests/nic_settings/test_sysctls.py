"""Per-interface sysctls through the real hooks (real namespaces and veths; the "host" is a throwaway
namespace): written in the pod, the host's recorded and set again when the NIC comes back."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from driver.api.v1alpha1.network_config import InterfaceConfig
from driver.netlink.channel import libc
from driver.nic_settings import sysctls
from driver.nic_settings.writable_proc_sys import CLONE_NEWNS, MS_BIND, MS_PRIVATE, MS_REC, MS_REMOUNT, read_only
from harness.netns import NetnsFactory
from tests.support.hook_node import Node, sh, sysctl

pytestmark = [pytest.mark.root, pytest.mark.kernel]


def test_sysctls_are_set_in_the_pod_and_the_hosts_come_back(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    sh(node.host, "link", "set", node.nic, "mtu", "1500")
    subprocess.run(["ip", "netns", "exec", node.host, "sysctl", "-qw", f"net.ipv4.conf.{node.nic}.arp_ignore=2"])
    host_forwarding = sysctl(node.host, f"ipv4/conf/{node.nic}/forwarding")
    node.run({"name": "net1", "forwarding": not host_forwarding, "arpIgnore": 1, "arpAnnounce": 2})
    assert sysctl(node.pod_ns, "ipv4/conf/net1/forwarding") == int(not host_forwarding)
    assert sysctl(node.pod_ns, "ipv6/conf/net1/forwarding") == int(not host_forwarding)
    assert sysctl(node.pod_ns, "ipv4/conf/net1/arp_ignore") == 1
    assert sysctl(node.pod_ns, "ipv4/conf/net1/arp_announce") == 2
    stored = node.record("sysctls")
    assert stored["ipv4/arp_ignore"] == 2 and stored["ipv4/forwarding"] == host_forwarding
    node.hooks.stop_pod_sandbox(node.pod)
    # The kernel gave the NIC the host's defaults on its way back; the recorded values are set again.
    assert sysctl(node.host, f"ipv4/conf/{node.nic}/arp_ignore") == 2
    assert sysctl(node.host, f"ipv4/conf/{node.nic}/forwarding") == host_forwarding


def _with_read_only_proc_sys(fn: Callable[[], None]) -> None:
    """``fn`` in a thread whose mount namespace has ``/proc/sys`` read-only, as a container that is not
    ``privileged`` has it (threads it starts begin there too)."""
    failure: list[BaseException] = []

    def body() -> None:
        c = libc()
        try:
            for rc in (
                c.unshare(CLONE_NEWNS),
                c.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None),
                c.mount(b"/proc/sys", b"/proc/sys", None, ctypes.c_ulong(MS_BIND), None),
                c.mount(None, b"/proc/sys", None, ctypes.c_ulong(MS_REMOUNT | MS_BIND | os.ST_RDONLY), None),
            ):
                assert rc == 0, os.strerror(ctypes.get_errno())
            assert read_only("/proc/sys")
            with pytest.raises(OSError) as refused:  # what a plain write meets there
                os.open("/proc/sys/net/ipv4/conf/lo/arp_ignore", os.O_WRONLY)
            assert refused.value.errno == errno.EROFS
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            failure.append(exc)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if failure:
        raise failure[0]
    assert not read_only("/proc/sys"), "the test's own mounts were touched"


def test_sysctls_are_set_by_a_driver_whose_proc_sys_is_read_only(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    """The chart's unprivileged driver: IPv4's settings over rtnetlink, IPv6's forwarding through the
    thread with a writable /proc/sys; the host's values back on return the same ways."""
    node = Node(netns_factory, tmp_path)
    subprocess.run(["ip", "netns", "exec", node.host, "sysctl", "-qw", f"net.ipv4.conf.{node.nic}.arp_ignore=2"])
    proc_sys = node.hooks.host.proc_sys
    try:
        _with_read_only_proc_sys(lambda: node.run({"name": "net1", "arpIgnore": 1, "arpAnnounce": 2}))
        assert sysctl(node.pod_ns, "ipv4/conf/net1/arp_ignore") == 1
        assert sysctl(node.pod_ns, "ipv4/conf/net1/arp_announce") == 2
        assert proc_sys._pool is None, "IPv4 settings alone need no writable /proc/sys"
        _with_read_only_proc_sys(lambda: node.hooks.stop_pod_sandbox(node.pod))
        assert sysctl(node.host, f"ipv4/conf/{node.nic}/arp_ignore") == 2

        node2 = Node(netns_factory, tmp_path / "2")
        node2.hooks.host.proc_sys = proc_sys
        for family in ("ipv4", "ipv6"):  # not the defaults: a return that only resets them is seen
            key = f"net.{family}.conf.{node2.nic}.forwarding=1"
            subprocess.run(["ip", "netns", "exec", node2.host, "sysctl", "-qw", key], check=True)
        _with_read_only_proc_sys(lambda: node2.run({"name": "net1", "forwarding": True}))
        assert sysctl(node2.pod_ns, "ipv4/conf/net1/forwarding") == 1
        assert sysctl(node2.pod_ns, "ipv6/conf/net1/forwarding") == 1
        assert proc_sys._pool is not None
        _with_read_only_proc_sys(lambda: node2.hooks.stop_pod_sandbox(node2.pod))
        assert sysctl(node2.host, f"ipv6/conf/{node2.nic}/forwarding") == 1
        assert sysctl(node2.host, f"ipv4/conf/{node2.nic}/forwarding") == 1
    finally:
        proc_sys.close()
    assert not read_only("/proc/sys")


def test_a_nic_without_sysctls_records_none(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    node.run({"name": "net1"})
    assert node.record("sysctls") is None
    node.hooks.stop_pod_sandbox(node.pod)


def test_the_keys_a_config_sets() -> None:
    assert sysctls.wanted(None) == {} and sysctls.wanted(InterfaceConfig(name="net1")) == {}
    assert sysctls.wanted(InterfaceConfig(forwarding=True, arp_ignore=8)) == {
        "ipv4/forwarding": 1,
        "ipv6/forwarding": 1,
        "ipv4/arp_ignore": 8,
    }
    assert sysctls.path("ipv4/arp_ignore", "net1") == "/proc/sys/net/ipv4/conf/net1/arp_ignore"
