"""Preparer logic against a real KubeClient talking to the fake apiserver, with a real checkpoint."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from driver.api.v1alpha1.merge import configs_for_request
from driver.api.v1alpha1.network_config import InterfaceConfig, NetworkConfig
from driver.checkpoint.state import PodNetState
from driver.checkpoint.store import CheckpointStore
from driver.claims import prepare as prepare_module
from driver.claims.claim_build import ClaimBuilder, base_request
from driver.claims.prepare import Preparer
from driver.dra.protocol import ClaimRef
from driver.kube.client import KubeClient
from driver.model.device import Device, HostFacts
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from tests.checkpoint.test_compaction import GatedOps
from tests.claims.conftest import NODE, inventory


def test_base_request() -> None:
    assert base_request("nic/sub") == "nic" and base_request("nic") == "nic"


def test_prepare_config_order_and_matching() -> None:
    """The default decoder applies class configs, then claim configs, in list order; only ours."""

    def entry(source: str, requests: list[str], name: str, driver: str = "dra.net") -> dict[str, Any]:
        return {
            "source": source,
            "requests": requests,
            "opaque": {"driver": driver, "parameters": {"interface": {"name": name}}},
        }

    configs = [
        entry("FromClaim", [], "claimall"),
        entry("FromClaim", ["gpu"], "other"),
        entry("FromClass", ["nic"], "class"),
        entry("FromClaim", ["nic/sub"], "sub"),
        entry("FromClaim", [], "gpu", driver="gpu.example.com"),
    ]
    assert configs_for_request(configs, "nic/sub").interface.name == "sub"
    assert configs_for_request(configs[:3], "nic/sub").interface.name == "claimall"  # class first, claim wins
    assert configs_for_request(configs[2:3] + configs[4:], "nic").interface.name == "class"
    assert configs_for_request([], "nic") == NetworkConfig()


async def test_prepare_mixed_claim_records_checkpoint(api: FakeAPIServer, preparer: Preparer) -> None:
    configs = [
        {
            "source": "FromClaim",
            "requests": ["nic"],
            "opaque": {"driver": "dra.net", "parameters": {"interface": {"mtu": 9000}}},
        }
    ]
    api.add_claim(
        make_claim(
            "ns",
            "c1",
            "uid-1",
            [
                result("pci-0000-8a-00-0", NODE, "nic/sub"),
                result("gpu-0", NODE, "gpu", driver="gpu.example.com"),
                result("pci-0000-8a-00-1", NODE, "nic"),
            ],
            configs=configs,
            pods=["pod-1"],
        )
    )
    out = await preparer.prepare([ClaimRef("ns", "c1", "uid-1")])
    assert out["uid-1"].error == ""
    assert [(d.request_names, d.pool, d.device) for d in out["uid-1"].devices] == [
        (["nic"], NODE, "pci-0000-8a-00-0"),
        (["nic"], NODE, "pci-0000-8a-00-1"),
    ]
    record = preparer.store.read(lambda s: s.claims["uid-1"])
    assert record.pod_uids == ["pod-1"]
    assert record.devices[0].snapshot.host.rdma_device == "mlx5_0"
    assert record.devices[0].config == NetworkConfig(interface=InterfaceConfig(mtu=9000))
    # Persisted: a fresh store reads the same record.
    again = CheckpointStore(preparer.store.directory).read(lambda s: s.claims["uid-1"])
    assert again.devices[1].device == "pci-0000-8a-00-1" and again.namespace == "ns"


async def test_retry_is_idempotent_without_second_get(api: FakeAPIServer, preparer: Preparer) -> None:
    api.add_claim(make_claim("ns", "c1", "uid-1", [result("pci-0000-8a-00-0", NODE)]))
    first = await preparer.prepare([ClaimRef("ns", "c1", "uid-1")])
    gets = api.count("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1")
    second = await preparer.prepare([ClaimRef("ns", "c1", "uid-1")])
    assert first == second and first["uid-1"].devices
    assert api.count("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1") == gets == 1


async def test_per_claim_errors_do_not_fail_others(api: FakeAPIServer, preparer: Preparer) -> None:
    api.add_claim(make_claim("ns", "good", "uid-good", [result("pci-0000-8a-00-0", NODE)]))
    api.add_claim(make_claim("ns", "replaced", "uid-new", [result("pci-0000-8a-00-1", NODE)]))
    unallocated = make_claim("ns", "pending", "uid-pending", [])
    unallocated["status"] = {}
    api.add_claim(unallocated)
    api.add_claim(make_claim("ns", "foreign", "uid-foreign", [result("pci-0000-8a-00-2", "node-b")]))
    api.add_claim(make_claim("ns", "unknown", "uid-unknown", [result("pci-9999-00-00-0", NODE)]))
    refs = [
        ClaimRef("ns", "good", "uid-good"),
        ClaimRef("ns", "replaced", "uid-old"),
        ClaimRef("ns", "pending", "uid-pending"),
        ClaimRef("ns", "missing", "uid-missing"),
        ClaimRef("ns", "foreign", "uid-foreign"),
        ClaimRef("ns", "unknown", "uid-unknown"),
    ]
    out = await preparer.prepare(refs)
    assert set(out) == {r.uid for r in refs}
    assert out["uid-good"].error == "" and len(out["uid-good"].devices) == 1
    assert "replaced" in out["uid-old"].error and "uid-new" in out["uid-old"].error
    assert "not allocated" in out["uid-pending"].error
    assert "not found" in out["uid-missing"].error
    assert "node-b" in out["uid-foreign"].error and "pool" in out["uid-foreign"].error
    assert "pci-9999-00-00-0" in out["uid-unknown"].error
    assert preparer.store.read(lambda s: sorted(s.claims)) == ["uid-good"]


async def test_a_config_the_decoder_refuses_is_that_claims_error(api: FakeAPIServer, preparer: Preparer) -> None:
    bad = [{"requests": [], "opaque": {"driver": "dra.net", "parameters": {"interface": {"mtu": 1}}}}]
    api.add_claim(make_claim("ns", "bad", "uid-bad", [result("pci-0000-8a-00-0", NODE)], configs=bad))
    api.add_claim(make_claim("ns", "ok", "uid-ok", [result("pci-0000-8a-00-1", NODE)]))
    out = await preparer.prepare([ClaimRef("ns", "bad", "uid-bad"), ClaimRef("ns", "ok", "uid-ok")])
    assert "config for request" in out["uid-bad"].error and "interface.mtu" in out["uid-bad"].error
    assert out["uid-ok"].error == ""


async def test_inventory_crash_is_contained(api: FakeAPIServer, preparer: Preparer) -> None:
    def broken() -> dict[str, Device]:
        raise RuntimeError("scan exploded")

    preparer.builder.devices = broken
    api.add_claim(make_claim("ns", "c", "uid-c", [result("pci-0000-8a-00-0", NODE)]))
    out = await preparer.prepare([ClaimRef("ns", "c", "uid-c")])
    assert "scan exploded" in out["uid-c"].error


async def test_unprepare_removes_and_unknown_succeeds(api: FakeAPIServer, preparer: Preparer) -> None:
    api.add_claim(make_claim("ns", "c1", "uid-1", [result("pci-0000-8a-00-0", NODE)], pods=["p"]))
    await preparer.prepare([ClaimRef("ns", "c1", "uid-1")])
    preparer.store.update(lambda s: s.pods.setdefault("p", PodNetState("p")))
    errors = await preparer.unprepare([ClaimRef("ns", "c1", "uid-1"), ClaimRef("ns", "never", "uid-never")])
    assert errors == {"uid-1": "", "uid-never": ""}
    assert preparer.store.read(lambda s: (dict(s.claims), sorted(s.pods))) == ({}, ["p"])  # pods untouched


async def test_concurrent_prepares_group_commit(api: FakeAPIServer, preparer: Preparer) -> None:
    preparer.builder.devices = lambda: inventory(40)
    for i in range(40):
        api.add_claim(make_claim("ns", f"c{i}", f"uid-{i}", [result(f"pci-0000-8a-00-{i}", NODE)]))
    outs = await asyncio.gather(*(preparer.prepare([ClaimRef("ns", f"c{i}", f"uid-{i}")]) for i in range(40)))
    assert all(o[f"uid-{i}"].error == "" for i, o in enumerate(outs))
    assert len(CheckpointStore(preparer.store.directory).read(lambda s: s.claims)) == 40


async def test_a_prepare_does_not_wait_for_the_background_compaction(
    api: FakeAPIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal is folded in the background once the claims are quiet (here at once): a prepare
    arriving while the compaction syncs its new file is answered without waiting for it, and the
    next compaction folds it in."""
    monkeypatch.setattr(prepare_module, "COMPACT_AFTER", 0.0)
    gate = GatedOps()
    store = CheckpointStore(tmp_path / "state", ops=gate, journal=True)
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    preparer = Preparer(kube, store, ClaimBuilder(inventory, "dra.net", NODE))
    for i in range(2):
        api.add_claim(make_claim("ns", f"c{i}", f"uid-{i}", [result(f"pci-0000-8a-00-{i}", NODE)]))
    assert (await preparer.prepare([ClaimRef("ns", "c0", "uid-0")]))["uid-0"].error == ""
    assert await asyncio.to_thread(gate.entered.wait, 10)  # the compaction is in its file's sync
    try:
        second = await asyncio.wait_for(preparer.prepare([ClaimRef("ns", "c1", "uid-1")]), 5)
    finally:
        gate.release.set()
    assert second["uid-1"].error == ""
    for _ in range(100):  # the compaction ends, and the next one folds the second claim
        if not store.journal_size and store.directory.joinpath("checkpoint.json").exists():
            break
        await asyncio.sleep(0.05)
    assert not store.journal_size
    snapshot = json.loads(store.directory.joinpath("checkpoint.json").read_bytes())
    assert sorted(snapshot["claims"]) == ["uid-0", "uid-1"]


async def test_calls_on_the_servers_thread_wake_the_loop_once_and_the_compaction_waits_for_the_last(
    api: FakeAPIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet's calls run on the DRA server's thread: the first change arms the journal's
    compaction on the event loop, the later ones only push it back (no wake of the loop while their
    answers go out); it runs once the claims have been quiet for ``COMPACT_AFTER``, and an empty
    call changes nothing."""
    quiet = 0.4
    monkeypatch.setattr(prepare_module, "COMPACT_AFTER", quiet)
    store = CheckpointStore(tmp_path / "state", journal=True)
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    preparer = Preparer(kube, store, ClaimBuilder(inventory, "dra.net", NODE))
    preparer.bind_loop(asyncio.get_running_loop())
    wakes: list[float] = []
    schedule = preparer._commit.schedule_compaction
    monkeypatch.setattr(preparer._commit, "schedule_compaction", lambda: (wakes.append(0.0), schedule())[1])
    for i in range(4):
        api.add_claim(make_claim("ns", f"c{i}", f"uid-{i}", [result(f"pci-0000-8a-00-{i}", NODE)]))

    def calls() -> float:
        assert preparer.prepare_now([]) == {}
        for i in range(4):
            assert preparer.prepare_now([ClaimRef("ns", f"c{i}", f"uid-{i}")])[f"uid-{i}"].error == ""
            time.sleep(0.05)  # the loop has armed the compaction after the first change
            assert preparer.unprepare_now([ClaimRef("ns", f"c{i}", f"uid-{i}")]) == {f"uid-{i}": ""}
            changed = time.monotonic()
            time.sleep(0.1)
        return changed

    last_change = await asyncio.to_thread(calls)
    assert len(wakes) == 1, "one wake of the loop for eight changes"
    assert store.journal_size, "not folded while the claims change"
    while store.journal_size:
        await asyncio.sleep(0.02)
    assert time.monotonic() - last_change >= quiet, "folded only once quiet"


# -- the KubeClient transport prepare depends on (driver/kube/client.py) ------------------------------


def test_kube_errors_and_token_file(api: FakeAPIServer, tmp_path: Path) -> None:
    import json as _json

    from driver.kube.errors import KubeError, NotFound

    kc = api.write_kubeconfig(tmp_path / "kc")
    config = _json.loads(kc.read_text())
    config["users"][0]["user"] = {"tokenFile": "token"}  # relative to the kubeconfig's directory
    (tmp_path / "token").write_text("secret-1\n")
    kc.write_text(_json.dumps(config))
    kube = KubeClient.from_kubeconfig(str(kc))
    assert kube.api.token.get() == "secret-1"
    with pytest.raises(KubeError) as err:
        kube.read_namespaced_resource_claim("ns", "nope")
    assert isinstance(err.value, NotFound) and 'resourceclaims.resource.k8s.io "nope" not found' == err.value.message


def test_kube_config_errors_name_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from driver.kube.errors import KubeConfigError
    from driver.kube.transport import transport_in_cluster

    kc = tmp_path / "kc"
    kc.write_text("apiVersion: v1\ncurrent-context: x\ncontexts: []\n")
    with pytest.raises(KubeConfigError, match="current-context 'x' is not in contexts"):
        KubeClient.from_kubeconfig(str(kc))
    kc.write_text(
        "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', certificate-authority: nope.crt}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    with pytest.raises(KubeConfigError, match=r"clusters\['c'\].certificate-authority: cannot read"):
        KubeClient.from_kubeconfig(str(kc))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        transport_in_cluster(str(tmp_path))


def test_kube_exec_credentials_fall_back_to_the_kubernetes_package(tmp_path: Path) -> None:
    from driver.kube.transport import Urllib3Transport

    kc = tmp_path / "kc"
    kc.write_text(
        "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: 'true'}}}]\n"
    )
    assert not isinstance(KubeClient.from_kubeconfig(str(kc)).api, Urllib3Transport)


def _numa_inventory() -> dict[str, Device]:
    """Two NICs on NUMA 0 and one on NUMA 1."""
    devs = {}
    for i, node in enumerate((0, 0, 1)):
        name = f"pci-0000-9a-00-{i}"
        devs[name] = Device(
            name=name,
            attributes={"dra.net/rdma": True, "dra.net/numaNode": node},
            host=HostFacts(pci_address=f"0000:9a:00.{i}", rdma_device=f"mlx5_{i}", numa_node=node),
        )
    return devs


async def test_numa_pin_across_numa_nodes_is_a_per_claim_error(api: FakeAPIServer, tmp_path: Path) -> None:

    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    preparer = Preparer(kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(_numa_inventory, "dra.net", NODE))
    pin = [
        {"source": "FromClaim", "requests": [], "opaque": {"driver": "dra.net", "parameters": {"numa": {"pin": True}}}}
    ]
    api.add_claim(
        make_claim(
            "ns",
            "spans",
            "uid-s",
            [result("pci-0000-9a-00-0", NODE), result("pci-0000-9a-00-2", NODE)],
            configs=pin,
            pods=["p"],
        )
    )
    api.add_claim(
        make_claim(
            "ns",
            "fits",
            "uid-f",
            [result("pci-0000-9a-00-0", NODE), result("pci-0000-9a-00-1", NODE)],
            configs=pin,
            pods=["p"],
        )
    )
    out = await preparer.prepare([ClaimRef("ns", "spans", "uid-s"), ClaimRef("ns", "fits", "uid-f")])
    assert "ResourceClaim ns/spans" in out["uid-s"].error and "numa.pin" in out["uid-s"].error
    assert "node 0: pci-0000-9a-00-0" in out["uid-s"].error and "node 1: pci-0000-9a-00-2" in out["uid-s"].error
    assert out["uid-f"].error == "" and len(out["uid-f"].devices) == 2
    assert preparer.store.read(lambda s: sorted(s.claims)) == ["uid-f"]  # the refused claim is not recorded


async def test_unprepare_hands_removed_claims_to_on_unprepare(api: FakeAPIServer, tmp_path: Path) -> None:
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    seen: list[str] = []
    preparer = Preparer(
        kube,
        CheckpointStore(tmp_path / "state"),
        ClaimBuilder(inventory, "dra.net", NODE),
        on_unprepare=lambda claim: seen.append(claim.uid),
    )
    api.add_claim(make_claim("ns", "c1", "uid-1", [result("pci-0000-8a-00-0", NODE)]))
    assert (await preparer.prepare([ClaimRef("ns", "c1", "uid-1")]))["uid-1"].error == ""
    out = await preparer.unprepare([ClaimRef("ns", "c1", "uid-1"), ClaimRef("ns", "gone", "uid-unknown")])
    assert out == {"uid-1": "", "uid-unknown": ""}
    assert seen == ["uid-1"]  # unknown claims succeed but are not reported


async def test_on_unprepare_that_waits_never_blocks_the_event_loop(api: FakeAPIServer, tmp_path: Path) -> None:
    """The NICs' way home at unprepare waits for the NRI hooks' lock, held through a pod's moves:
    meanwhile the loop serves the kubelet's other calls; a failing callback skips no other claim."""
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    released = threading.Event()
    seen: list[str] = []

    def on_unprepare(claim: Any) -> None:
        if claim.uid == "uid-1":
            raise RuntimeError("hooks gone")
        assert released.wait(10), "the loop never ran while on_unprepare waited"
        seen.append(claim.uid)

    preparer = Preparer(
        kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(inventory, "dra.net", NODE), on_unprepare=on_unprepare
    )
    refs = [ClaimRef("ns", f"c{i}", f"uid-{i}") for i in (1, 2)]
    for i, ref in enumerate(refs):
        api.add_claim(make_claim("ns", ref.name, ref.uid, [result(f"pci-0000-8a-00-{i}", NODE)]))
    out = await preparer.prepare(refs)
    assert all(r.error == "" for r in out.values())

    async def release() -> None:
        await asyncio.sleep(0.05)
        released.set()

    answered, _ = await asyncio.wait_for(asyncio.gather(preparer.unprepare(refs), release()), 15)
    assert answered == {"uid-1": "", "uid-2": ""}
    assert seen == ["uid-2"]


async def test_ethtool_settings_the_nic_cannot_take_fail_at_prepare(
    api: FakeAPIServer, tmp_path: Path, netns_factory
) -> None:
    """A real veth: a known feature prepares; an unknown one is a per-claim error naming it."""

    host, _peer = netns_factory.veth()
    dev = Device(name="veth-nic", host=HostFacts(ifname=host))
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    preparer = Preparer(
        kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(lambda: {dev.name: dev}, "dra.net", NODE)
    )

    def claim(name: str, uid: str, features: dict[str, bool]) -> None:
        cfg = [
            {
                "source": "FromClaim",
                "requests": [],
                "opaque": {"driver": "dra.net", "parameters": {"ethtool": {"features": features}}},
            }
        ]
        api.add_claim(make_claim("ns", name, uid, [result(dev.name, NODE)], configs=cfg, pods=["p"]))

    claim("good", "uid-good", {"generic-receive-offload": True})
    claim("bad", "uid-bad", {"no-such-offload": False})
    out = await preparer.prepare([ClaimRef("ns", "good", "uid-good"), ClaimRef("ns", "bad", "uid-bad")])
    assert out["uid-good"].error == ""
    assert "ResourceClaim ns/bad" in out["uid-bad"].error and "no-such-offload" in out["uid-bad"].error
    assert host in out["uid-bad"].error
    assert preparer.store.read(lambda s: sorted(s.claims)) == ["uid-good"]


@pytest.mark.parametrize("name", ["../../../api/v1/nodes/node-a", "..", "c%2F..%2Fx", "ok/../c"])
async def test_a_claim_name_never_steers_the_request_to_another_path(
    api: FakeAPIServer, preparer: Preparer, name: str
) -> None:
    """A name the kubelet passes on is a path segment or nothing: a name no object can have is this
    claim's error, and no request leaves for another path."""
    before = list(api.requests)
    out = await preparer.prepare([ClaimRef("ns", name, "uid-steer")])
    assert "is not an object name" in out["uid-steer"].error
    assert api.requests == before, api.requests[len(before) :]
