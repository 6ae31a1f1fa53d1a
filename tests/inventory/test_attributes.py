"""Attribute limits: 64-byte values shortened safely, at most 32 attributes a device."""

from __future__ import annotations

from driver.inventory.attributes import CLOUD_PRIORITY, PRIORITY, finalize, shorten

VF_ONLY = {"dra.net/pfPciAddress", "dra.net/vfIndex", "dra.net/pfName", "dra.net/pfDeviceID"}
"""What only a VF carries (its PF's facts): never on a device with ``sriovVfs`` (a PF)."""
IOMMU_ONLY = {"dra.net/iommuGroup", "dra.net/vfioUnsafe", "dra.net/vfioUnsafeReason", "dra.net/pciDriver"}
"""What only a function behind an IOMMU carries (``pciDriver``: a VF on vfio-pci, without a netdev):
not a cloud VM's NIC (no virtual IOMMU shown to the guest on GCE or Azure)."""


def test_short_values_untouched() -> None:
    assert shorten("dra.net/pciDevice", "MT2910 Family [ConnectX-7]") == "MT2910 Family [ConnectX-7]"


def test_long_string_cut_to_64_bytes_on_char_boundary() -> None:
    value = "é" * 40  # 80 bytes
    out = shorten("dra.net/pciDevice", value)
    assert len(out.encode()) <= 64 and out == "é" * 32
    assert shorten("dra.net/alias", "x" * 100) == "x" * 64


def test_ip_list_cut_at_cidr_boundary() -> None:
    cidrs = [f"10.96.{i}.{i}/32" for i in range(10)]  # kube-ipvs0 style
    out = shorten("dra.net/ipv4", ",".join(cidrs))
    assert len(out) <= 64
    assert out.split(",") == cidrs[: len(out.split(","))]
    assert out == "10.96.0.0/32,10.96.1.1/32,10.96.2.2/32,10.96.3.3/32,10.96.4.4/32"


def test_list_with_no_whole_element_is_omitted() -> None:
    huge = "2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff/128" * 2
    assert "dra.net/ipv6" not in finalize({"dra.net/ipv6": huge, "dra.net/rdma": True})


def test_cap_drops_lowest_priority_deterministically() -> None:
    # Not a VF: neither its PF's facts nor pciDriver (a VF on vfio-pci).
    base = [n for n in PRIORITY if n not in CLOUD_PRIORITY and n not in VF_ONLY and n != "dra.net/pciDriver"]
    attrs: dict = {name: "v" for name in base}
    attrs.update({f"cloud.example/a{i:02d}": i for i in range(20)})
    out = finalize(attrs)
    assert len(out) == 32
    assert set(base) <= set(out)  # the 28 known ones kept, then the first others by name
    others = 32 - len(base)
    assert sorted(k for k in out if k.startswith("cloud")) == [f"cloud.example/a{i:02d}" for i in range(others)]
    small = {n: "v" for n in PRIORITY[:31]}
    assert finalize(small) == small


def test_cloud_topology_outranks_descriptive_attributes() -> None:
    # Every attribute a GCE NIC can have (a ConnectX-8 Data Direct function is not one of them).
    base = [
        n
        for n in PRIORITY
        if n not in CLOUD_PRIORITY and n not in VF_ONLY | IOMMU_ONLY and n != "dra.net/dataDirectPciAddress"
    ]
    gce = [n for n in CLOUD_PRIORITY if n.startswith("gce.")]
    azure = [n for n in CLOUD_PRIORITY if n.startswith("azure.")]
    # A GCE NIC with every attribute (eBPF names and an alias too) is over by three: the end of the
    # descriptive tail goes (alias, the eBPF program names), never a placement attribute.
    attrs: dict = {name: "v" for name in (*base, *gce)}
    out = finalize(attrs)
    assert set(attrs) - set(out) == {"dra.net/alias", "dra.net/tcxProgramNames", "dra.net/tcFilterNames"}
    # More than fits: the descriptive tail goes first, the placement attributes stay.
    attrs.update({name: "v" for name in azure})
    out = finalize(attrs)
    assert set(azure) | set(gce) <= set(out)
    dropped = set(attrs) - set(out)
    assert dropped == set(base[-(len(attrs) - 32) :])  # alias, ipv6, ipv4, ...: the end of PRIORITY


def test_an_azure_vf_keeps_its_pf_and_placement_facts() -> None:
    # Azure's RDMA NICs are mlx5 VFs: every attribute a VF can have, with Azure's placement ones.
    vf = [
        n
        for n in PRIORITY
        if n not in CLOUD_PRIORITY
        and n not in IOMMU_ONLY
        and n not in ("dra.net/sriovVfs", "dra.net/dataDirectPciAddress")
    ]
    azure = [n for n in CLOUD_PRIORITY if n.startswith("azure.")]
    attrs: dict = {name: "v" for name in (*vf, *azure)}
    out = finalize(attrs)
    assert VF_ONLY | set(azure) <= set(out)
    assert set(attrs) - set(out) <= {
        "dra.net/alias",
        "dra.net/tcxProgramNames",
        "dra.net/tcFilterNames",
        "dra.net/ebpf",
    }
