"""rdma_nldev.make_once_freed with the kernel's answers scripted: a soft device made again once its
old namesake is gone, never taken for made while the old one only lingers in sysfs (it stays there
while it unregisters), found made when a registered device of that name is on the NIC already."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest

from driver.netlink import rdma_nldev
from driver.netlink.rdma_nldev import RdmaMoveError


class Kernel:
    """The RDMA core as make_once_freed sees it: the registered devices (name -> port netdev), and
    the answers of the next NEWLINKs (EEXIST while the old name is held)."""

    def __init__(self, registered: dict[str, str], held_for: int = 0) -> None:
        self.registered, self.held_for, self.newlinks = registered, held_for, 0

    def dump(self, *_args: object) -> list[bytes]:
        return []

    def make(self, channel: object, name: str, link_type: str, netdev: str) -> None:
        self.newlinks += 1
        if self.newlinks <= self.held_for:
            raise RdmaMoveError(name, "File exists", errno.EEXIST)
        self.registered[name] = netdev


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    k = Kernel({})
    monkeypatch.setattr(rdma_nldev, "make_soft_device", k.make)
    monkeypatch.setattr(rdma_nldev, "parse_port_netdevs", lambda _p: {n: (1, d) for n, d in k.registered.items()})
    return k


def test_made_once_the_old_name_is_freed(kernel: Kernel, tmp_path: Path) -> None:
    kernel.held_for = 3
    rdma_nldev.make_once_freed(kernel, str(tmp_path), "rxe0", "rxe", "eth1", existing_ok=True, wait=5)  # type: ignore[arg-type]
    assert kernel.newlinks == 4 and kernel.registered == {"rxe0": "eth1"}


def test_an_old_device_lingering_in_sysfs_is_never_taken_for_the_new_one(kernel: Kernel, tmp_path: Path) -> None:
    (tmp_path / "class/infiniband/rxe0").mkdir(parents=True)  # unregistering: in sysfs, not registered
    kernel.held_for = 1000
    start = time.monotonic()
    with pytest.raises(RdmaMoveError) as raised:
        rdma_nldev.make_once_freed(kernel, str(tmp_path), "rxe0", "rxe", "eth1", existing_ok=True, wait=0.3)  # type: ignore[arg-type]
    assert raised.value.code == errno.EEXIST and 0.3 <= time.monotonic() - start < 5
    assert kernel.registered == {}


def test_a_registered_device_on_the_nic_is_made_already(kernel: Kernel, tmp_path: Path) -> None:
    kernel.registered["rxe0"] = "eth1"
    rdma_nldev.make_once_freed(kernel, str(tmp_path), "rxe0", "rxe", "eth1", existing_ok=True, wait=5)  # type: ignore[arg-type]
    assert kernel.newlinks == 0, "a return retried after a crash: nothing to make"
    kernel.registered["rxe0"] = "eth9"  # the name on another NIC is not this one's
    kernel.held_for = 1000
    with pytest.raises(RdmaMoveError):
        rdma_nldev.make_once_freed(kernel, str(tmp_path), "rxe0", "rxe", "eth1", existing_ok=True, wait=0.2)  # type: ignore[arg-type]


def test_a_dump_cut_short_is_not_taken_for_made(kernel: Kernel, tmp_path: Path) -> None:
    """The RDMA dump fails when devices are made or deleted meanwhile: then the device is made."""

    def cut(*_args: object) -> list[bytes]:
        raise OSError(errno.EINTR, "netlink dump interrupted")

    kernel.dump = cut  # type: ignore[method-assign]
    rdma_nldev.make_once_freed(kernel, str(tmp_path), "rxe0", "rxe", "eth1", existing_ok=True, wait=5)  # type: ignore[arg-type]
    assert kernel.newlinks == 1 and kernel.registered == {"rxe0": "eth1"}
