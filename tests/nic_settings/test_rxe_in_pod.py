"""Soft-RoCE made again in the pod (a kernel whose rxe has network namespaces), against fakes: the
plan's record, the RDMA netlink sent in the pod's namespace, the char devices the containers get,
the claim's ``RDMA`` condition, the device deleted first at the return, and an rxe device that cannot
be made in the pod leaving none behind (the pod starts without RDMA, the record says why)."""

from __future__ import annotations

import errno
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from driver.checkpoint.state import MovedDevice, PreparedDevice
from driver.claims.status_entries import DeviceResult, _rdma_condition
from driver.model.device import CharDevice, Device, HostFacts
from driver.netlink import rdma_nldev
from driver.netlink.channel import NLMSGHDR
from driver.netlink.namespaces import NetnsGone
from driver.nic_settings import rdma
from driver.nri.container_adjustment import without_stay_home_rdma

NEWLINK, DELLINK, PORT_GET = 0x1403, 0x1404, 0x1405


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def _port(index: int, name: str, netdev: str | None) -> bytes:
    out = _attr(1, struct.pack("=I", index)) + _attr(2, name.encode() + b"\0") + _attr(3, struct.pack("=I", 1))
    return out + (_attr(51, netdev.encode() + b"\0") if netdev else b"")


class FakeNldev:
    """The kernel's nldev in one namespace: a port dump of ``ports`` (index, name, netdev there or
    None), NEWLINK answered with ``newlink_errno`` (0: the device is made, on its netdev), DELLINK acked."""

    def __init__(self, ports: list[tuple[int, str, str | None]] = (), newlink_errno: int = 0) -> None:
        self.ports = list(ports)
        self.newlink_errno = newlink_errno
        self.sent: list[tuple[int, bytes]] = []
        self.queue: list[bytes] = []

    def setsockopt(self, *a: object) -> None:
        pass

    def send(self, data: bytes) -> int:
        _length, kind, _flags, seq, _pid = NLMSGHDR.unpack_from(data)
        self.sent.append((kind, data[16:]))
        if kind == PORT_GET:
            for port in self.ports:
                payload = _port(*port)
                self.queue.append(NLMSGHDR.pack(16 + len(payload), kind, 2, seq, 0) + payload)
            self.queue.append(NLMSGHDR.pack(20, 3, 2, seq, 0) + b"\0" * 4)  # NLMSG_DONE
            return len(data)
        code = 0
        if kind == NEWLINK:
            code = self.newlink_errno
            if not code:
                self.ports.append((7, "rxe0", "eth9"))
        err = struct.pack("=i", -code) + data[:16]
        self.queue.append(NLMSGHDR.pack(16 + len(err), 2, 0, seq, 0) + err)
        return len(data)

    def recv(self, size: int) -> bytes:
        return self.queue.pop(0)

    def close(self) -> None:
        pass

    def kinds(self) -> list[int]:
        return [kind for kind, _ in self.sent]


def _sysfs(root: Path, *, verbs: bool = True) -> str:
    """A sysfs with soft device rxe0 (no bus device) and, when ``verbs``, its uverbs3 and the CM."""
    dev = root / "class/infiniband/rxe0"
    dev.mkdir(parents=True)
    (dev / "node_type").write_text("1: CA\n")
    (root / "class/infiniband_verbs").mkdir(parents=True)
    if verbs:
        (root / "class/infiniband_verbs/uverbs3").mkdir()
        (root / "class/infiniband_verbs/uverbs3/ibdev").write_text("rxe0\n")
        (root / "class/infiniband_verbs/uverbs3/dev").write_text("231:195\n")
        (root / "class/infiniband_verbs/uverbs1").mkdir()
        (root / "class/infiniband_verbs/uverbs1/ibdev").write_text("mlx5_0\n")
        (root / "class/infiniband_verbs/uverbs1/dev").write_text("231:193\n")
    (root / "class/misc/rdma_cm").mkdir(parents=True)
    (root / "class/misc/rdma_cm/dev").write_text("10:58\n")
    return str(root)


class FakeNamespaces:
    def __init__(self, sock: FakeNldev) -> None:
        self.sock = sock
        self.opened: list[tuple[int, int]] = []

    def socket_in(self, fd: int, proto: int) -> FakeNldev:
        self.opened.append((fd, proto))
        return self.sock


def _host(sysfs_root: str, sock: FakeNldev, *, rxe_in_pod: bool = True, exclusive: bool = False) -> Any:
    return SimpleNamespace(
        ns=FakeNamespaces(sock), fd=3, sysfs_root=sysfs_root, rxe_in_pod=rxe_in_pod, rdma_exclusive=exclusive
    )


def _nic() -> Any:
    host = HostFacts(ifname="eth9", rdma_device="rxe0")
    return SimpleNamespace(
        name="nic-0",
        records={},
        device=SimpleNamespace(snapshot=Device(name="nic-0", host=host)),
        pod=SimpleNamespace(ifname="eth9"),
        sub_interface=False,
    )


def _plan(host: Any) -> Any:
    nic = _nic()
    rdma.RdmaDevice().plan([nic], host, SimpleNamespace())
    return nic


def _moved_in(root: Path) -> None:
    """The host's device gone: the move destroyed it."""
    (root / "class/infiniband/rxe0/node_type").unlink()
    (root / "class/infiniband/rxe0").rmdir()


def test_delete_and_port_dump_messages_byte_for_byte() -> None:
    kind, flags, body = rdma_nldev.dellink_request(7)
    assert (kind, flags) == ((5 << 10) + 4, 0x1 | 0x4)  # RDMA_NLDEV_CMD_DELLINK, NLM_F_REQUEST | NLM_F_ACK
    assert body == _attr(1, struct.pack("=I", 7))  # RDMA_NLDEV_ATTR_DEV_INDEX
    assert rdma_nldev.RDMA_NLDEV_CMD_PORT_GET == 5 and rdma_nldev.RXE_PORT == 4791
    ports = [_port(2, "rxe1", None), _port(7, "rxe0", "eth9")]
    assert rdma_nldev.parse_port_netdevs(ports) == {"rxe1": (2, None), "rxe0": (7, "eth9")}


def test_the_plan_says_in_pod_only_where_the_kernel_allows_and_in_shared_mode(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    assert _plan(_host(root, FakeNldev())).records["rdma"] == {"soft": "rxe0", "type": "rxe", "in_pod": True}
    for host in (_host(root, FakeNldev(), rxe_in_pod=False), _host(root, FakeNldev(), exclusive=True)):
        record = _plan(host).records["rdma"]
        assert record["soft"] == "rxe0" and "Soft-RoCE" in record["reason"] and "in_pod" not in record


def test_made_in_the_pods_namespace_with_its_char_devices(tmp_path: Path) -> None:
    sock = FakeNldev()
    host = _host(_sysfs(tmp_path), sock)
    nic = _plan(host)
    _moved_in(tmp_path)
    pod = SimpleNamespace(host=host, fd=11)
    rdma.RdmaDevice().in_pod([nic], pod)
    assert host.ns.opened == [(11, rdma_nldev.NETLINK_RDMA)], "the socket is opened in the pod's namespace"
    assert sock.sent == [(NEWLINK, rdma_nldev.newlink_request("rxe0", "rxe", "eth9")[2])]
    record = nic.records["rdma"]
    assert rdma.made_in_pod(record) == "rxe0" and rdma.stays_home(record) is None
    assert record["char_devices"] == [
        {"path": "/dev/infiniband/uverbs3", "major": 231, "minor": 195},
        {"path": "/dev/infiniband/rdma_cm", "major": 10, "minor": 58},
    ]


@pytest.mark.parametrize("why", [errno.EOPNOTSUPP, errno.EPERM])
def test_one_the_kernel_refuses_leaves_none_and_the_pod_starts_without_rdma(tmp_path: Path, why: int) -> None:
    sock = FakeNldev(newlink_errno=why)
    host = _host(_sysfs(tmp_path), sock)
    nic = _plan(host)
    _moved_in(tmp_path)
    rdma.RdmaDevice().in_pod([nic], SimpleNamespace(host=host, fd=11))
    assert sock.kinds() == [NEWLINK], "nothing made, nothing to delete"
    record = nic.records["rdma"]
    assert rdma.made_in_pod(record) is None
    assert "could not be made in the pod's network namespace" in record["reason"], record
    assert record["soft"] == "rxe0" and record["type"] == "rxe", "made again on the host at the return"


def test_one_made_without_its_char_devices_is_deleted_again(tmp_path: Path) -> None:
    sock = FakeNldev()
    root = _sysfs(tmp_path, verbs=False)
    host = _host(root, sock)
    nic = _plan(host)
    _moved_in(tmp_path)
    rdma.RdmaDevice().in_pod([nic], SimpleNamespace(host=host, fd=11))
    assert sock.kinds() == [NEWLINK, PORT_GET, DELLINK]
    assert sock.sent[-1][1] == rdma_nldev.dellink_request(7)[2]
    assert "uverbs" in nic.records["rdma"]["reason"]


def _moved(record: dict[str, Any]) -> MovedDevice:
    return MovedDevice(device="nic-0", host_ifname="eth9", pod_ifname="eth9", records={"rdma": record})


def test_at_the_return_the_pods_device_is_deleted_first_only_while_its_netdev_is_there(tmp_path: Path) -> None:
    record = {"soft": "rxe0", "type": "rxe", "in_pod": True, "char_devices": []}
    sock = FakeNldev(ports=[(2, "rxe1", None), (7, "rxe0", "eth9")])
    host = _host(str(tmp_path), sock)
    rdma.RdmaDevice().before_return([_moved(record)], SimpleNamespace(host=host, fd=11))
    assert host.ns.opened == [(11, rdma_nldev.NETLINK_RDMA)]
    assert sock.kinds() == [PORT_GET, DELLINK] and sock.sent[-1][1] == rdma_nldev.dellink_request(7)[2]
    # Home already (a restarted driver returning it again): the host's remade rxe0 is not the pod's.
    home = FakeNldev(ports=[(9, "rxe0", None)])
    rdma.RdmaDevice().before_return([_moved(record)], SimpleNamespace(host=_host(str(tmp_path), home), fd=11))
    assert home.kinds() == [PORT_GET]


def test_a_gone_pod_namespace_is_no_error_at_the_return(tmp_path: Path) -> None:
    class Gone:
        host = _host(str(tmp_path), FakeNldev())

        @property
        def fd(self) -> int:
            raise NetnsGone("/run/netns/gone")

    rdma.RdmaDevice().before_return([_moved({"soft": "rxe0", "type": "rxe", "in_pod": True})], Gone())


def test_containers_get_the_pods_device_char_devices_and_the_claim_says_rdma_true() -> None:
    host = HostFacts(ifname="eth9", rdma_device="rxe0", char_devices=[CharDevice("/dev/infiniband/uverbs0", 231, 192)])
    device = PreparedDevice(request="nic", pool="node", device="nic-0", snapshot=Device(name="nic-0", host=host))
    chars = [{"path": "/dev/infiniband/uverbs3", "major": 231, "minor": 195}]
    record = {"soft": "rxe0", "type": "rxe", "in_pod": True, "char_devices": chars}
    (seen,) = without_stay_home_rdma([device], [_moved(record)])
    assert seen.snapshot.host.rdma_device == "rxe0"
    assert seen.snapshot.host.char_devices == [CharDevice("/dev/infiniband/uverbs3", 231, 195)]
    condition = _rdma_condition(DeviceResult("nic-0", "eth9", rdma_in_pod="rxe0"))
    assert condition is not None and (condition["status"], condition["reason"]) == ("True", "RDMADeviceMadeInPod")
    assert _rdma_condition(DeviceResult("nic-0", "eth9")) is None


def test_the_probe_is_not_asked_without_rdma_rxe(tmp_path: Path) -> None:
    assert rdma_nldev.rxe_netns_probe(str(tmp_path)) == (
        False,
        "rdma_rxe is not loaded (no Soft-RoCE device on this node)",
    )


def _share(share_id: str = "5f0c9e2a-77aa-4c1b-9d7e-1b2c3d4e5f60") -> Any:
    """A share of the NIC: a sub-interface in the pod (``net1``), the NIC and its rxe0 on the host."""
    nic = _nic()
    nic.sub_interface = True
    nic.device.share_id = share_id
    nic.claim = SimpleNamespace(uid="claim-uid")
    nic.pod = SimpleNamespace(ifname="net1")
    return nic


def test_a_share_gets_an_rxe_device_of_its_own_on_its_sub_interface(tmp_path: Path) -> None:
    sock = FakeNldev()
    host = _host(_sysfs(tmp_path), sock)
    nic = _share()
    rdma.RdmaDevice().plan([nic], host, SimpleNamespace())
    name = rdma.share_device_name("rxe0", "5f0c9e2a-77aa-4c1b-9d7e-1b2c3d4e5f60")
    assert name == "rxe0s5f0c9e2a"
    assert nic.records["rdma"] == {"soft": name, "type": "rxe", "in_pod": True, "share": True}
    rdma.RdmaDevice().in_pod([nic], SimpleNamespace(host=host, fd=11))
    assert sock.sent[0] == (NEWLINK, rdma_nldev.newlink_request(name, "rxe", "net1")[2]), "on the sub-interface"
    # No share's device is ever made on the host: the host's rxe0 never left its NIC.
    moved = MovedDevice(device="nic-0", host_ifname="eth9", pod_ifname="net1", records={"rdma": nic.records["rdma"]})
    home = FakeNldev()
    rdma.RdmaDevice().after_return(moved, _host(str(tmp_path), home))
    assert home.sent == []


def test_a_share_keeps_the_hosts_device_where_the_kernel_cannot_and_in_exclusive_mode(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    for host in (_host(root, FakeNldev(), rxe_in_pod=False), _host(root, FakeNldev(), exclusive=True)):
        nic = _share()
        rdma.RdmaDevice().plan([nic], host, SimpleNamespace())
        assert nic.records == {}, "nothing moved, nothing made: the share keeps the host's device"


def test_a_share_whose_device_cannot_be_made_stays_a_share_and_nothing_is_made_on_the_host(tmp_path: Path) -> None:
    sock = FakeNldev(newlink_errno=errno.EEXIST)
    host = _host(_sysfs(tmp_path), sock)
    nic = _share()
    rdma.RdmaDevice().plan([nic], host, SimpleNamespace())
    rdma.RdmaDevice().in_pod([nic], SimpleNamespace(host=host, fd=11))
    record = nic.records["rdma"]
    assert record["share"] is True and "could not be made" in record["reason"] and rdma.made_in_pod(record) is None
    moved = MovedDevice(device="nic-0", host_ifname="eth9", pod_ifname="net1", records={"rdma": record})
    home = FakeNldev()
    rdma.RdmaDevice().after_return(moved, _host(str(tmp_path), home))
    assert home.sent == []


def test_a_shares_containers_get_its_own_devices_name_and_char_devices() -> None:
    host = HostFacts(ifname="eth9", rdma_device="rxe0", char_devices=[CharDevice("/dev/infiniband/uverbs0", 231, 192)])
    device = PreparedDevice(request="nic", pool="node", device="nic-0", snapshot=Device(name="nic-0", host=host))
    chars = [{"path": "/dev/infiniband/uverbs4", "major": 231, "minor": 196}]
    record = {"soft": "rxe0sabc", "type": "rxe", "in_pod": True, "share": True, "char_devices": chars}
    (seen,) = without_stay_home_rdma([device], [_moved(record)])
    assert seen.snapshot.host.rdma_device == "rxe0sabc"
    assert seen.snapshot.host.char_devices == [CharDevice("/dev/infiniband/uverbs4", 231, 196)]
