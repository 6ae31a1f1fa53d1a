"""``interface.dhcp`` at prepare: stored for the NRI hooks; refused on an InfiniBand (IPoIB) NIC."""

from __future__ import annotations

from pathlib import Path

from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.prepare import Preparer
from driver.dra.protocol import ClaimRef
from driver.kube.client import KubeClient
from driver.model.device import Device
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from tests.claims.conftest import NODE, inventory

DHCP = [{"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": {"interface": {"dhcp": True}}}}]


def _inventory() -> dict[str, Device]:
    devs = inventory(2)
    devs["pci-0000-8a-00-0"].attributes["dra.net/encapsulation"] = "ether"
    devs["pci-0000-8a-00-1"].attributes["dra.net/encapsulation"] = "infiniband"
    return devs


async def test_dhcp_is_stored_on_ethernet_and_refused_on_ipoib(tmp_path: Path) -> None:
    with FakeAPIServer() as api:
        kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        preparer = Preparer(kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(_inventory, "dra.net", NODE))
        for uid, device in (("uid-eth", "pci-0000-8a-00-0"), ("uid-ib", "pci-0000-8a-00-1")):
            api.add_claim(make_claim("ns", uid, uid, [result(device, NODE)], configs=DHCP, pods=["p"]))
        out = await preparer.prepare([ClaimRef("ns", "uid-eth", "uid-eth"), ClaimRef("ns", "uid-ib", "uid-ib")])
    assert out["uid-eth"].error == ""
    [stored] = CheckpointStore(tmp_path / "state").read(lambda s: s.claims["uid-eth"].devices)
    assert stored.config.interface is not None and stored.config.interface.dhcp is True
    assert out["uid-ib"].error == (
        "ResourceClaim ns/uid-ib: config for request 'nic': interface.dhcp: device pci-0000-8a-00-1 is an "
        "InfiniBand (IPoIB) interface; DHCP works on Ethernet interfaces only"
    )
