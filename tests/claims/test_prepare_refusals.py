"""What NodePrepareResources must refuse, or not do: shared NICs, clashing settings, foreign claims,
hostile configs. A real KubeClient against the fake apiserver, a real checkpoint."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.prepare import Preparer
from driver.dra.protocol import ClaimRef
from driver.kube.client import KubeClient
from driver.model.device import Device, HostFacts
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from tests.claims.conftest import NODE

P = "status.allocation.devices.config[0].opaque.parameters"


def _config(params: object, requests: list[str] | None = None) -> dict:
    entry: dict = {"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


async def test_300_claims_on_one_nic_prepare_exactly_one(api: FakeAPIServer, preparer: Preparer) -> None:
    for i in range(300):
        api.add_claim(make_claim("ns", f"c{i}", f"uid-{i}", [result("pci-0000-8a-00-0", NODE)], pods=[f"p{i}"]))
    outs = await asyncio.gather(*(preparer.prepare([ClaimRef("ns", f"c{i}", f"uid-{i}")]) for i in range(300)))
    answers = {uid: r for o in outs for uid, r in o.items()}
    ok = [uid for uid, r in answers.items() if not r.error]
    assert len(ok) == 1
    (holder,) = ok
    holder_name = f"c{holder.removeprefix('uid-')}"
    for uid, r in answers.items():
        if uid != holder:
            assert f"already held by ResourceClaim ns/{holder_name} (uid {holder})" in r.error, r.error
            assert not r.devices
    assert preparer.store.read(lambda s: list(s.claims)) == [holder]
    # Once the holder is unprepared, the NIC is free for the next claim.
    await preparer.unprepare([ClaimRef("ns", holder_name, holder)])
    other = "uid-7" if holder != "uid-7" else "uid-8"
    again = await preparer.prepare([ClaimRef("ns", f"c{other.removeprefix('uid-')}", other)])
    assert again[other].error == ""


async def test_admin_access_claims_may_share_a_nic(api: FakeAPIServer, preparer: Preparer) -> None:
    shared = dict(result("pci-0000-8a-00-1", NODE), adminAccess=True)
    api.add_claim(make_claim("ns", "owner", "uid-owner", [result("pci-0000-8a-00-1", NODE)]))
    api.add_claim(make_claim("ns", "admin1", "uid-admin1", [shared]))
    api.add_claim(make_claim("ns", "admin2", "uid-admin2", [shared]))
    refs = [ClaimRef("ns", n, f"uid-{n}") for n in ("owner", "admin1", "admin2")]
    out = await preparer.prepare(refs)
    assert {u: r.error for u, r in out.items()} == {"uid-owner": "", "uid-admin1": "", "uid-admin2": ""}
    assert preparer.store.read(lambda s: s.claims["uid-admin1"].devices[0].shared) is True


async def test_a_claim_with_only_other_drivers_devices_prepares_nothing(
    api: FakeAPIServer, preparer: Preparer, caplog
) -> None:
    """The kubelet asks only about claims with devices of ours (its batches are per driver in the
    allocation), and needs an entry for each claim it asked about, an error failing the pod. A
    claim without any of ours gets an empty entry (nothing of ours to prepare) and is not
    recorded as prepared."""
    api.add_claim(make_claim("ns", "gpus", "uid-gpus", [result("gpu-0", NODE, "gpu", driver="gpu.example.com")]))
    with caplog.at_level(logging.DEBUG, logger="driver.claims.prepare"):
        out = await preparer.prepare([ClaimRef("ns", "gpus", "uid-gpus")])
    assert out["uid-gpus"].error == "" and out["uid-gpus"].devices == []
    assert preparer.store.read(lambda s: dict(s.claims)) == {}
    (record,) = [r for r in caplog.records if "no devices of this driver" in r.getMessage()]
    assert record.levelno == logging.DEBUG and record.kv["claim"] == "ns/gpus"


async def test_two_requests_of_one_claim_cannot_share_name_address_or_mac(
    api: FakeAPIServer, preparer: Preparer
) -> None:
    cases = {
        "name": ({"interface": {"name": "net1"}}, "interface.name", "interface name 'net1'"),
        "address": (
            {"interface": {"addresses": ["10.1.0.5/24"]}},
            "interface.addresses",
            "address '10.1.0.5'",
        ),
        "mac": (
            {"interface": {"hardwareAddr": "02:00:00:00:00:0a"}},
            "interface.hardwareAddr",
            "MAC address '02:00:00:00:00:0a'",
        ),
    }
    for key, (params, field, what) in cases.items():
        results = [result("pci-0000-8a-00-0", NODE, "a"), result("pci-0000-8a-00-1", NODE, "b")]
        api.add_claim(make_claim("ns", key, f"uid-{key}", results, configs=[_config(params)]))
        out = await preparer.prepare([ClaimRef("ns", key, f"uid-{key}")])
        assert f"{P}.{field}" in out[f"uid-{key}"].error and what in out[f"uid-{key}"].error, out
    assert preparer.store.read(lambda s: dict(s.claims)) == {}


async def test_hostile_configs_get_the_errors_dranet_validate_gives(api: FakeAPIServer, preparer: Preparer) -> None:
    """The claim as the API server keeps it: opaque parameters byte for byte as the user sent them."""

    def raw_claim(name: str, parameters: str) -> bytes:
        claim = make_claim("ns", name, f"uid-{name}", [result("pci-0000-8a-00-0", NODE)], configs=[_config("@@")])
        return json.dumps(claim).replace('"@@"', parameters).encode()

    api.raw_claims[("ns", "big")] = raw_claim("big", '{"interface": {"mtu": ' + "9" * 5000 + "}}")
    api.raw_claims[("ns", "deep")] = raw_claim("deep", '{"interface": {"name": ' + "[" * 800 + "]" * 800 + "}}")
    api.raw_claims[("ns", "dup")] = raw_claim("dup", '{"interface": {"mtu": 1500, "mtu": 9000}}')
    api.add_claim(make_claim("ns", "fine", "uid-fine", [result("pci-0000-8a-00-1", NODE)]))
    out = await preparer.prepare([ClaimRef("ns", n, f"uid-{n}") for n in ("big", "deep", "dup", "fine")])
    assert f"{P}.interface.mtu: must be between 68 and 65536, got an integer of 5000 digits" in out["uid-big"].error
    assert "nested more than 64 levels deep" in out["uid-deep"].error
    assert f"{P}.interface.mtu: is given more than once in the same object" in out["uid-dup"].error
    assert out["uid-fine"].error == ""
    for uid in ("uid-big", "uid-deep", "uid-dup"):
        assert "Traceback" not in out[uid].error and len(out[uid].error) < 400


@pytest.mark.root
@pytest.mark.parametrize(
    ("mtu", "reason"),
    [(65000, "interface.mtu: 65000 is above the MTU 9000 of its PF pf0"), (65536, "above the NIC's maximum MTU 65535")],
    ids=["vf-above-its-pf", "above-the-nic-maximum"],
)
async def test_an_mtu_the_nic_cannot_take_is_refused_at_prepare(
    api: FakeAPIServer, tmp_path: Path, netns_factory, mtu: int, reason: str
) -> None:
    """As docs/configuration.md promises: a VF's MTU above its PF's (the VF found by its sysfs
    ``physfn``), or any NIC's above its driver's maximum (a real veth's, 65535), is this claim's error."""
    from tests.nri.test_hostile_tenant import _vf_sysfs

    nic, _ = netns_factory.veth()
    sysfs = _vf_sysfs(tmp_path / "sys", nic, 9000)
    devices = {"vf0": Device(name="vf0", attributes={"dra.net/ifName": nic}, host=HostFacts(ifname=nic))}
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    preparer = Preparer(
        kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(lambda: devices, "dra.net", NODE, sysfs_root=sysfs)
    )
    api.add_claim(make_claim("ns", "c", "uid-c", [result("vf0", NODE)], configs=[_config({"interface": {"mtu": mtu}})]))
    out = await preparer.prepare([ClaimRef("ns", "c", "uid-c")])
    assert reason in out["uid-c"].error and f"device {nic}" in out["uid-c"].error, out["uid-c"].error
    ok = make_claim("ns", "ok", "uid-ok", [result("vf0", NODE)], configs=[_config({"interface": {"mtu": 9000}})])
    api.add_claim(ok)
    assert (await preparer.prepare([ClaimRef("ns", "ok", "uid-ok")]))["uid-ok"].error == ""


@pytest.mark.root
async def test_a_claims_nics_are_checked_over_one_socket_and_its_config_decoded_once(
    api: FakeAPIServer, tmp_path: Path, netns_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four real NICs of one request with an MTU: one netlink socket for their checks and one decode
    of the request's config; an MTU above their maximum still refused, naming the NIC."""
    from driver.api.v1alpha1 import merge
    from driver.claims import claim_build
    from driver.netlink import mtu_limits

    nics = [netns_factory.veth()[0] for _ in range(4)]
    devices = {
        f"n{i}": Device(name=f"n{i}", attributes={"dra.net/ifName": n}, host=HostFacts(ifname=n))
        for i, n in enumerate(nics)
    }
    sockets, decodes = [], []
    real_socket, real_decode = mtu_limits.netlink_socket, merge.configs_for_request
    monkeypatch.setattr(mtu_limits, "netlink_socket", lambda *a: sockets.append(a) or real_socket(*a))
    monkeypatch.setattr(claim_build, "configs_for_request", lambda *a: decodes.append(a) or real_decode(*a))
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    preparer = Preparer(kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(lambda: devices, "dra.net", NODE))
    results = [result(f"n{i}", NODE) for i in range(4)]
    api.add_claim(make_claim("ns", "c", "uid-c", results, configs=[_config({"interface": {"mtu": 9000}})]))
    assert (await preparer.prepare([ClaimRef("ns", "c", "uid-c")]))["uid-c"].error == ""
    assert (len(sockets), len(decodes)) == (1, 1)
    await preparer.unprepare([ClaimRef("ns", "c", "uid-c")])
    api.add_claim(make_claim("ns", "big", "uid-big", results, configs=[_config({"interface": {"mtu": 65536}})]))
    out = (await preparer.prepare([ClaimRef("ns", "big", "uid-big")]))["uid-big"]
    assert "above the NIC's maximum MTU 65535" in out.error and f"device {nics[0]}" in out.error, out.error


async def test_a_claim_whose_nics_overflow_the_pods_netlink_batch_is_refused(
    api: FakeAPIServer, preparer: Preparer
) -> None:
    """What admission cannot count (allocationMode All) is counted at prepare, on the devices allocated."""
    routes = [{"destination": f"10.{i}.0.0/16", "gateway": "192.168.1.1"} for i in range(100)]
    results = [result(f"pci-0000-8a-00-{i}", NODE) for i in range(2)]
    api.add_claim(make_claim("ns", "wide", "uid-wide", results, configs=[_config({"routes": routes})]))
    out = await preparer.prepare([ClaimRef("ns", "wide", "uid-wide")])
    error = out["uid-wide"].error
    assert "202 netlink requests" in error and "at most 200" in error, error
    assert preparer.store.read(lambda s: dict(s.claims)) == {}
    api.add_claim(make_claim("ns", "fits", "uid-fits", results[:1], configs=[_config({"routes": routes})]))
    assert (await preparer.prepare([ClaimRef("ns", "fits", "uid-fits")]))["uid-fits"].error == ""
