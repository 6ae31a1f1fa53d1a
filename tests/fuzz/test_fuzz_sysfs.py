"""Random bytes in the files the discovery scan reads, on a kernel-shaped fixture tree.

Every regular file of the tree is a candidate (the scanner reads most of them; the others cost
nothing). Property: the scan finishes within the deadline, and every device it publishes is valid
for the API server (a DNS-label name, at most 32 attributes, strings of at most 64 bytes of valid
UTF-8, integers in int64), so one bad value can never make a whole ResourceSlice invalid.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devcluster.doubles.sysfs_fixture import build
from driver.dra.slices import plan_slices
from driver.inventory.discovery import Scanner
from driver.inventory.names import is_dns_label
from driver.model.device import INT64_MAX, INT64_MIN, MAX_ATTRIBUTE_VALUE_LENGTH, MAX_ATTRIBUTES_PER_DEVICE, Device
from tests.fuzz import EXAMPLES, FUZZ


class Tree:
    """A fixture tree whose files are overwritten per example and restored afterwards."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = sorted(
            p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and "devices/system" not in str(p)
        )
        # The NUMA topology files the list form of the NUMA attribute reads (node distance rows,
        # a node's cpulist, its first CPU's package), fuzzed by their own test: there are many.
        self.topology = sorted(
            p
            for p in (root / "devices/system").rglob("*")
            if p.is_file() and not p.is_symlink() and p.name in ("distance", "cpulist", "physical_package_id")
        )
        self.original = {p: p.read_bytes() for p in (*self.files, *self.topology)}

    def restore(self, paths: list[Path] | None = None) -> None:
        for path in self.original if paths is None else paths:
            path.write_bytes(self.original[path])


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tree]:
    yield Tree(build("single-socket", tmp_path_factory.mktemp("fuzz-sysfs") / "sys"))


def assert_publishable(devices: list[Device]) -> None:
    names = [d.name for d in devices]
    assert len(names) == len(set(names)), names
    for device in devices:
        assert is_dns_label(device.name), device.name
        assert len(device.attributes) <= MAX_ATTRIBUTES_PER_DEVICE
        for key, value in device.attributes.items():
            if isinstance(value, str):
                assert len(value.encode("utf-8")) <= MAX_ATTRIBUTE_VALUE_LENGTH, (key, value)  # valid UTF-8 too
            elif isinstance(value, list):  # the list form of an int attribute (DRAListTypeAttributes)
                assert value and all(type(v) is int and INT64_MIN <= v <= INT64_MAX for v in value), (key, value)
            elif not isinstance(value, bool):
                assert isinstance(value, int) and INT64_MIN <= value <= INT64_MAX, (key, value)
    plan = plan_slices(devices, [], "dra.net", "node-1", "uid-1")
    for body in plan.create:
        json.dumps(body, ensure_ascii=False).encode("utf-8")  # what goes on the wire


values = st.one_of(
    st.binary(max_size=80),
    st.sampled_from([b"", b"\n", b"-1\n", b"99999999999999999999999\n", b"9" * 5000, b"0x02\n", b"\xff\xfe\n"]),
    st.integers().map(lambda i: f"{i}\n".encode()),
    st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")),
)


@FUZZ
@given(st.data())
def test_random_bytes_in_some_files(tree: Tree, data: st.DataObject) -> None:
    chosen = data.draw(st.dictionaries(st.sampled_from(tree.files), values, max_size=40))
    try:
        for path, content in chosen.items():
            path.write_bytes(content)
        assert_publishable(Scanner(str(tree.root), pci_ids_paths=()).scan())
    finally:
        tree.restore(list(chosen))


@settings(FUZZ, max_examples=EXAMPLES // 3)  # each example rewrites the whole tree (~300 files)
@given(st.integers(0, 2**32), st.integers(0, 80), st.sampled_from([b"", b"-1", b"\xff", b"9" * 30]))
def test_random_bytes_in_every_file(tree: Tree, seed: int, size: int, common: bytes) -> None:
    rng = random.Random(seed)
    try:
        for path in tree.files:
            path.write_bytes(rng.randbytes(rng.randint(0, size)) if rng.random() < 0.8 else common)
        assert_publishable(Scanner(str(tree.root), pci_ids_paths=()).scan())
    finally:
        tree.restore()


@FUZZ
@given(st.data())
def test_random_bytes_in_the_numa_topology(tree: Tree, data: st.DataObject) -> None:
    """``--feature-gates DRAListTypeAttributes=true``: the NUMA attribute as a list, read from the
    node distance table and the CPUs' packages; garbage there never makes a device unpublishable."""
    assert tree.topology, "the fixture has no NUMA topology files"
    chosen = data.draw(st.dictionaries(st.sampled_from(tree.topology), values, min_size=1, max_size=10))
    try:
        for path, content in chosen.items():
            path.write_bytes(content)
        assert_publishable(Scanner(str(tree.root), pci_ids_paths=(), numa_list=True).scan())
    finally:
        tree.restore(list(chosen))
