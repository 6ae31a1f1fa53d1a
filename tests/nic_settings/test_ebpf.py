"""eBPF programs off a NIC moved into a pod, through the real hooks (real namespaces, veths and
programs; the "host" is a throwaway namespace)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.netns import NetnsFactory
from tests.support import bpf_progs
from tests.support.hook_node import Node

pytestmark = [pytest.mark.root, pytest.mark.kernel]


def test_ebpf_programs_are_detached_and_recorded(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    fds = bpf_progs.attach_all(node.host, node.nic)
    try:
        node.run({"name": "net1", "disableEbpfPrograms": True})
        link = json.loads(
            subprocess.run(
                ["ip", "-j", "-n", node.pod_ns, "-d", "link", "show", "net1"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )[0]
        assert "xdp" not in link, link
        tcx = bpf_progs.has_tcx()  # before Linux 6.6 there is none to attach, and the driver's query of none is fine
        if tcx:
            assert bpf_progs.tcx_count(node.pod_ns, "net1") == 0
        record = node.record("ebpf")
        assert sorted((r["hook"], r["how"]) for r in record) == [
            ("tc-ingress", "removed by the namespace move"),
            *([("tcx-ingress", "detached")] if tcx else []),
            ("xdp-generic", "detached"),
        ]
        assert all(isinstance(r["id"], int) and r["id"] > 0 for r in record)
        node.hooks.stop_pod_sandbox(node.pod)
    finally:
        for fd in fds:
            os.close(fd)


def test_without_the_setting_programs_stay(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    fds = bpf_progs.attach_all(node.host, node.nic)
    try:
        node.run({"name": "net1"})
        link = subprocess.run(["ip", "-j", "-n", node.pod_ns, "-d", "link", "show", "net1"], capture_output=True)
        assert "xdp" in json.loads(link.stdout)[0]
        if bpf_progs.has_tcx():
            assert bpf_progs.tcx_count(node.pod_ns, "net1") == 1
        assert node.record("ebpf") is None
        node.hooks.stop_pod_sandbox(node.pod)
    finally:
        for fd in fds:
            os.close(fd)


def test_a_program_held_by_a_bpf_link_is_left_attached_and_recorded(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    fds = bpf_progs.attach_xdp_link(node.host, node.nic)
    try:
        node.run({"name": "net1", "disableEbpfPrograms": True})  # the pod starts
        (record,) = node.record("ebpf")
        assert record["hook"] == "xdp-generic" and str(record["how"]).startswith("left attached: ")
        assert "Device or resource busy" in str(record["how"])
        node.hooks.stop_pod_sandbox(node.pod)
    finally:
        for fd in fds:
            os.close(fd)
