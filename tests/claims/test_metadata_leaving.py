"""An unprepared claim's metadata files go after the kubelet's answer, never a newer claim's; strays swept.

A real Preparer over a fake apiserver and a real checkpoint, as in ``test_device_metadata.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.device_metadata import DeviceMetadataWriter
from driver.claims.metadata_document import MetadataPaths, decode_first
from driver.claims.metadata_leaving import STRAY_AFTER
from driver.claims.prepare import Preparer
from driver.dra.protocol import ClaimRef
from driver.kube.client import KubeClient
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from tests.claims.conftest import NODE, inventory

UID = "0b5c7a52-1111-4222-8333-944455556666"
NEW_UID = "7d1e0f00-2222-4333-8444-a55566667777"
NAME = "pod-devices-x7k2p"


@pytest.fixture
def paths(tmp_path: Path) -> MetadataPaths:
    return MetadataPaths("dra.net", str(tmp_path / "plugins/dra.net"), str(tmp_path / "cdi"))


@pytest.fixture
def writer(paths: MetadataPaths) -> DeviceMetadataWriter:
    return DeviceMetadataWriter(paths)


@pytest.fixture
def preparer(api: FakeAPIServer, tmp_path: Path, writer: DeviceMetadataWriter) -> Preparer:
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    return Preparer(
        kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(inventory, "dra.net", NODE), metadata=writer
    )


def _claim(api: FakeAPIServer, uid: str, devices: tuple[str, ...] = ("pci-0000-8a-00-0",)) -> dict[str, Any]:
    return api.add_claim(make_claim("ns", NAME, uid, [result(d, NODE) for d in devices]))


def _files(paths: MetadataPaths) -> list[str]:
    """Every file of ours, relative to the test's directory tree."""
    out = [str(p.relative_to(paths.directory)) for p in Path(paths.directory).rglob("*") if p.is_file()]
    out += [p.name for p in Path(paths.cdi_dir).glob("*")]
    return sorted(out)


def _uid_in_file(paths: MetadataPaths) -> str:
    return str(decode_first(paths.file("ns", NAME, "nic").read_bytes())["metadata"]["uid"])


async def test_the_files_stay_until_the_next_removal(
    api: FakeAPIServer, preparer: Preparer, writer: DeviceMetadataWriter, paths: MetadataPaths
) -> None:
    _claim(api, UID)
    ref = ClaimRef("ns", NAME, UID)
    assert (await preparer.prepare([ref]))[UID].error == ""
    written = _files(paths)
    assert len(written) == 2  # the metadata file and the CDI spec
    assert await preparer.unprepare([ref]) == {UID: ""}
    assert _files(paths) == written  # not removed on the kubelet's call
    assert writer.remove_leaving() == 1
    assert _files(paths) == []
    assert not paths.claim_dir("ns", NAME).exists()
    assert writer.remove_leaving() == 0  # each claim's files once


async def test_the_same_claim_prepared_again_keeps_its_files(
    api: FakeAPIServer, preparer: Preparer, writer: DeviceMetadataWriter, paths: MetadataPaths
) -> None:
    """A claim a later pod uses again: prepared again before its files went; the removal that
    follows must not take them."""
    _claim(api, UID)
    ref = ClaimRef("ns", NAME, UID)
    await preparer.prepare([ref])
    written = _files(paths)
    await preparer.unprepare([ref])
    assert (await preparer.prepare([ref]))[UID].error == ""
    assert writer.remove_leaving() == 0  # nothing left to remove: the claim is prepared again
    assert _files(paths) == written
    assert _uid_in_file(paths) == UID
    writer.keep_all(full=True)  # and the check finds them as they should be
    assert writer.take_mends() == []


async def test_a_claim_made_again_under_the_name_gets_only_its_own_files(
    api: FakeAPIServer, preparer: Preparer, writer: DeviceMetadataWriter, paths: MetadataPaths
) -> None:
    """The claim deleted and made again (a new UID, the same namespace and name, the same metadata
    directory): the old claim's CDI spec goes before the new claim's files are written, and a later
    removal leaves the new ones."""
    _claim(api, UID)
    await preparer.prepare([ClaimRef("ns", NAME, UID)])
    await preparer.unprepare([ClaimRef("ns", NAME, UID)])
    api.claims.clear()
    _claim(api, NEW_UID)
    assert (await preparer.prepare([ClaimRef("ns", NAME, NEW_UID)]))[NEW_UID].error == ""
    specs = sorted(p.name for p in Path(paths.cdi_dir).glob("*"))
    assert specs == [f"dra.net_metadata_{NEW_UID}_nic.json"]
    assert writer.remove_leaving() == 0
    assert _uid_in_file(paths) == NEW_UID
    assert len(_files(paths)) == 2


async def test_a_request_the_claim_no_longer_has_goes(
    api: FakeAPIServer, preparer: Preparer, writer: DeviceMetadataWriter, paths: MetadataPaths
) -> None:
    """The same claim prepared again with fewer requests of ours: the files of the other go."""
    claim = _claim(api, UID)
    claim["spec"]["devices"]["requests"].append({"name": "other", "exactly": {"deviceClassName": "dranet.net"}})
    claim["status"]["allocation"]["devices"]["results"].append({**result("pci-0000-8a-00-1", NODE), "request": "other"})
    ref = ClaimRef("ns", NAME, UID)
    assert (await preparer.prepare([ref]))[UID].error == ""
    assert len(_files(paths)) == 4
    await preparer.unprepare([ref])
    claim["spec"]["devices"]["requests"].pop()
    claim["status"]["allocation"]["devices"]["results"].pop()
    assert (await preparer.prepare([ref]))[UID].error == ""
    assert _files(paths) == sorted(
        [f"dra-device-metadata/ns_{NAME}/nic/metadata.json", f"dra.net_metadata_{UID}_nic.json"]
    )


async def test_an_unprepare_racing_the_check_leaves_no_files(
    api: FakeAPIServer, preparer: Preparer, writer: DeviceMetadataWriter, paths: MetadataPaths
) -> None:
    """The check read the claim as prepared; the claim is unprepared before it looks at its files
    (damaged meanwhile): it writes nothing, and the removal takes what is there."""
    _claim(api, UID)
    ref = ClaimRef("ns", NAME, UID)
    await preparer.prepare([ref])
    assert preparer.store is not None
    [record] = preparer.store.read(lambda s: list(s.claims.values()))
    await preparer.unprepare([ref])
    paths.file("ns", NAME, "nic").write_text("damaged")
    writer.keep([record], full=True)  # the check with what it read before the unprepare
    assert writer.remove_leaving() == 1
    assert _files(paths) == []


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


async def test_strays_are_swept_once_old_and_owned_files_never(
    api: FakeAPIServer, preparer: Preparer, writer: DeviceMetadataWriter, paths: MetadataPaths
) -> None:
    """Files a crash left (no claim owns them) go once unchanged for STRAY_AFTER; a stored claim's
    and another driver's stay, and so do fresh ones (a prepare in flight, another instance's)."""
    _claim(api, UID)
    await preparer.prepare([ClaimRef("ns", NAME, UID)])
    cdi, root = Path(paths.cdi_dir), paths.claim_dir("ns", NAME).parent
    old_dir, fresh_dir = root / "ns_gone", root / "ns_writing"
    for folder in (old_dir / "nic", fresh_dir / "nic"):
        folder.mkdir(parents=True)
        (folder / "metadata.json").write_text("{}")
    old_spec = cdi / "dra.net_metadata_11111111-2222-4333-8444-555566667777_nic.json"
    fresh_spec = cdi / "dra.net_metadata_99999999-2222-4333-8444-555566667777_nic.json"
    foreign = cdi / "gpu.example.com_claim_11111111-2222-4333-8444-555566667777.json"
    for f in (old_spec, fresh_spec, foreign):
        f.write_text("{}")
    for p in (old_dir, old_spec, foreign, paths.claim_dir("ns", NAME), cdi / f"dra.net_metadata_{UID}_nic.json"):
        _age(p, STRAY_AFTER + 5)
    removed = writer.sweep_strays()
    assert sorted(removed) == sorted([old_dir, old_spec])
    assert not old_dir.exists() and not old_spec.exists()
    assert fresh_dir.exists() and fresh_spec.exists() and foreign.exists()
    assert _uid_in_file(paths) == UID and (cdi / f"dra.net_metadata_{UID}_nic.json").exists()
    assert writer.sweep_strays() == []


def test_without_directories_nothing_is_swept(writer: DeviceMetadataWriter, tmp_path: Path) -> None:
    writer.bind(CheckpointStore(tmp_path / "state"), None)
    assert writer.sweep_strays() == []
