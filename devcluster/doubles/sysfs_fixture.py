"""Build fixture sysfs trees shaped exactly like the kernel's, from a topology description.

``python -m devcluster.doubles.sysfs_fixture --topology nd-h100-v5 --out DIR`` writes DIR with
``devices/pci<dom>:<bus>/.../<BDF>`` real directories, ``bus/pci/devices/<BDF>`` links,
``class/net``, ``class/infiniband``, ``class/infiniband_verbs``, ``class/infiniband_mad``,
``class/misc/rdma_cm`` and ``devices/system/node``. Every symlink is relative, as in the
kernel, so the tree can be moved or read through any root. Topologies live in
``devcluster/doubles/topologies/<name>.yaml`` (see ``nd-h100-v5.yaml`` for the full schema; a PCI
function's ``vpd: {name, ro: {KEYWORD: value}}`` writes its binary ``vpd`` file, see ``gb300.yaml``).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TOPOLOGY_DIR = Path(__file__).parent / "topologies"
UVERBS_MAJOR = 231


def topologies() -> list[str]:
    """Names of the bundled topologies."""
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.yaml"))


def load_topology(name: str) -> dict[str, Any]:
    """The parsed topology ``name`` (a bundled name or a path to a YAML file)."""
    path = Path(name) if name.endswith(".yaml") else TOPOLOGY_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"topology {name!r}: no such file {path} (known: {', '.join(topologies())})")
    with open(path, encoding="utf-8") as f:
        # libyaml's loader when present: a dev cluster's layout reads its topology on every use.
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _rid_to_bdf(domain: int, rid: int) -> str:
    return f"{domain:04x}:{rid >> 8:02x}:{(rid >> 3) & 0x1F:02x}.{rid & 7}"


def _bdf_to_rid(bdf: str) -> tuple[int, int]:
    dom, bus, devfn = bdf.split(":")
    dev, fn = devfn.split(".")
    return int(dom, 16), (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn)


def vpd_image(name: str, read_only: dict[str, str]) -> bytes:
    """A PCI VPD image as a device's ``vpd`` sysfs file returns it: the identifier string (large
    resource 0x82), the read-only keywords (0x90, closed by ``RV`` with the checksum that makes
    every byte up to it sum to zero), the end tag (0x78)."""
    ident = name.encode("ascii")
    out = bytearray([0x82, *len(ident).to_bytes(2, "little")]) + ident
    body = bytearray()
    for key, value in read_only.items():
        raw = value.encode("ascii")
        if len(key) != 2 or len(raw) > 255:
            raise ValueError(f"vpd keyword {key!r}: two characters and a value of at most 255 bytes")
        body += key.encode("ascii") + bytes([len(raw)]) + raw
    body += b"RV\x01"  # RV's one byte: the checksum, filled in below
    out += bytes([0x90, *(len(body) + 1).to_bytes(2, "little")]) + body
    out.append((-sum(out)) & 0xFF)
    out.append(0x78)
    return bytes(out)


def _mac(seed: int, prefix: str = "0c:42:a1") -> str:
    return f"{prefix}:{(seed >> 16) & 0xFF:02x}:{(seed >> 8) & 0xFF:02x}:{seed & 0xFF:02x}"


@dataclass
class Builder:
    """Writes one topology under ``out``; counters number uverbs/umad like the kernel (probe order)."""

    out: Path
    uverbs: int = 0
    nets: dict[str, Path] = field(default_factory=dict)
    masters: list[tuple[str, str]] = field(default_factory=list)

    def write(self, rel: Path | str, content: str | int) -> None:
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{content}\n")

    def write_bytes(self, rel: Path | str, content: bytes) -> None:
        """A binary attribute (``vpd``), as it is: no trailing newline."""
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)

    def link(self, rel: Path | str, target: Path | str) -> None:
        """A relative symlink ``rel`` -> ``target`` (both relative to the root)."""
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (self.out / target).exists():  # e.g. bus/pci/drivers/<name>
            (self.out / target).mkdir(parents=True)
        os.symlink(os.path.relpath(self.out / target, path.parent), path)

    # -- NUMA ---------------------------------------------------------------------------------
    def numa(self, nodes: list[dict[str, Any]]) -> None:
        ids = [n["id"] for n in nodes]
        contiguous = ids == list(range(len(ids)))
        online = (f"0-{len(ids) - 1}" if len(ids) > 1 else "0") if contiguous else ",".join(map(str, ids))
        self.write("devices/system/node/online", online)
        for node in nodes:
            base = f"devices/system/node/node{node['id']}"
            self.write(f"{base}/cpulist", node["cpulist"])
            self.write(f"{base}/distance", node["distance"])

    # -- netdevs ------------------------------------------------------------------------------
    def netdev(self, parent: Path, spec: dict[str, Any], device_link: bool = True) -> None:
        name = spec["name"]
        ndir = parent / "net" / name
        self.write(ndir / "address", spec["address"])
        self.write(ndir / "mtu", spec.get("mtu", 1500))
        self.write(ndir / "operstate", spec.get("operstate", "up"))
        self.write(ndir / "type", spec.get("type", 1))
        self.write(ndir / "ifindex", spec["ifindex"])
        self.write(ndir / "carrier", 1 if spec.get("operstate", "up") == "up" else 0)
        self.write(ndir / "ifalias", spec.get("alias", ""))
        if "speed" in spec:
            self.write(ndir / "speed", spec["speed"])
        if device_link:
            self.link(ndir / "device", parent)
        for sub in spec.get("dirs", []):  # e.g. bridge/, bonding/
            (self.out / ndir / sub).mkdir(parents=True, exist_ok=True)
        self.link(f"class/net/{name}", ndir)
        self.nets[name] = ndir
        if spec.get("master"):
            self.masters.append((name, spec["master"]))

    def finish_masters(self) -> None:
        for slave, master in self.masters:
            self.link(self.nets[slave] / "master", self.nets[master])
            self.link(self.nets[slave] / f"upper_{master}", self.nets[master])
            self.link(self.nets[master] / f"lower_{slave}", self.nets[slave])

    # -- RDMA ---------------------------------------------------------------------------------
    def rdma(self, fdir: Path, spec: dict[str, Any]) -> None:
        name = spec["name"]
        idir = fdir / "infiniband" / name
        self.write(idir / "node_type", "1: CA")
        self.write(idir / "fw_ver", spec.get("fw_ver", "28.39.1002"))
        self.write(idir / "node_guid", spec.get("node_guid", "0000:0000:0000:0000"))
        self.link(idir / "device", fdir)
        port = idir / "ports" / "1"
        self.write(port / "state", spec.get("state", "4: ACTIVE"))
        self.write(port / "phys_state", spec.get("phys_state", "5: LinkUp"))
        self.write(port / "link_layer", spec["link_layer"])
        self.write(port / "rate", spec["rate"])
        self.link(f"class/infiniband/{name}", idir)
        n = self.uverbs
        self.uverbs += 1
        vdir = fdir / "infiniband_verbs" / f"uverbs{n}"
        self.write(vdir / "ibdev", name)
        self.write(vdir / "dev", f"{UVERBS_MAJOR}:{192 + n}")
        self.link(vdir / "device", fdir)
        self.link(f"class/infiniband_verbs/uverbs{n}", vdir)
        if spec.get("mad"):
            for entry, minor in ((f"umad{n}", n), (f"issm{n}", 64 + n)):
                mdir = fdir / "infiniband_mad" / entry
                self.write(mdir / "ibdev", name)
                self.write(mdir / "port", 1)
                self.write(mdir / "dev", f"{UVERBS_MAJOR}:{minor}")
                self.link(f"class/infiniband_mad/{entry}", mdir)

    def soft_rdma(self, spec: dict[str, Any]) -> None:
        """A soft RDMA device (rxe, siw) as the kernel shows one: under ``devices/virtual``, no bus
        device, tied to its netdev by ``parent`` (rxe) and port 1's GID table."""
        name, kind = spec["name"], spec.get("kind", "rxe")
        idir = Path("devices/virtual/infiniband") / name
        self.write(idir / "node_type", "4: RNIC" if kind == "siw" else "1: CA")
        if kind == "rxe":
            self.write(idir / "parent", spec["netdev"])
        port = idir / "ports" / "1"
        self.write(port / "state", "4: ACTIVE")
        self.write(port / "link_layer", spec.get("link_layer", "Ethernet"))
        self.write(port / "rate", spec.get("rate", "10 Gb/sec (1X QDR)"))
        self.write(port / "gid_attrs" / "ndevs" / "0", spec["netdev"])
        self.link(f"class/infiniband/{name}", idir)
        n = self.uverbs
        self.uverbs += 1
        vdir = Path("devices/virtual/infiniband_verbs") / f"uverbs{n}"
        self.write(vdir / "ibdev", name)
        self.write(vdir / "dev", f"{UVERBS_MAJOR}:{192 + n}")
        self.link(f"class/infiniband_verbs/uverbs{n}", vdir)

    # -- PCI ----------------------------------------------------------------------------------
    def pci(
        self, spec: dict[str, Any], parent: Path | None = None, cpus: dict[int, str] | None = None, all_cpus: str = "0"
    ) -> Path:
        bdf = spec["bdf"]
        if parent is None:
            # The host bridge is named after the bus of the topmost device below it.
            dom, rid = _bdf_to_rid((spec.get("bridges") or [bdf])[0])
            parent = Path("devices") / f"pci{dom:04x}:{rid >> 8:02x}"
            for bridge in spec.get("bridges", []):
                parent = parent / bridge
        fdir = parent / bdf
        numa = spec.get("numa_node", -1)
        for key in ("class", "vendor", "device", "subsystem_vendor", "subsystem_device"):
            self.write(fdir / key, spec[key])
        self.write(fdir / "numa_node", numa)
        self.write(fdir / "local_cpulist", (cpus or {}).get(numa, all_cpus))
        self.write(fdir / "enable", 1)
        if spec.get("driver"):
            self.link(fdir / "driver", f"bus/pci/drivers/{spec['driver']}")
        if spec.get("vpd"):
            self.write_bytes(fdir / "vpd", vpd_image(spec["vpd"].get("name", ""), spec["vpd"].get("ro", {})))
        self.link(f"bus/pci/devices/{bdf}", fdir)
        for net in spec.get("net", []):
            self.netdev(fdir, net)
        if spec.get("rdma"):
            self.rdma(fdir, spec["rdma"])
        if spec.get("sriov"):
            self.vfs(spec, fdir, parent, cpus, all_cpus)
        return fdir

    def vfs(self, pf: dict[str, Any], pfdir: Path, parent: Path, cpus: dict[int, str] | None, all_cpus: str) -> None:
        sr = pf["sriov"]
        self.write(pfdir / "sriov_totalvfs", sr["total"])
        self.write(pfdir / "sriov_numvfs", sr["num"])
        self.write(pfdir / "sriov_offset", sr["offset"])
        self.write(pfdir / "sriov_stride", sr.get("stride", 1))
        dom, rid = _bdf_to_rid(pf["bdf"])
        vfio = set(sr.get("vfio", []))
        for n in range(sr["num"]):
            vf_bdf = _rid_to_bdf(dom, rid + sr["offset"] + n * sr.get("stride", 1))
            kernel = n not in vfio
            spec: dict[str, Any] = {
                "bdf": vf_bdf,
                "class": pf["class"],
                "vendor": pf["vendor"],
                "device": sr["vf_device"],
                "subsystem_vendor": pf["subsystem_vendor"],
                "subsystem_device": pf["subsystem_device"],
                "numa_node": pf.get("numa_node", -1),
                "driver": sr.get("vf_driver", pf.get("driver")) if kernel else "vfio-pci",
            }
            if kernel and sr.get("net_prefix"):
                spec["net"] = [
                    {
                        "name": f"{sr['net_prefix']}{n}",
                        "address": _mac(sr["mac_base"] + n),
                        "mtu": sr.get("mtu", 1500),
                        "ifindex": sr["ifindex_base"] + n,
                        "operstate": sr.get("operstate", "up"),
                        "speed": sr.get("speed", 100000),
                    }
                ]
            if kernel and sr.get("rdma_prefix") is not None:
                spec["rdma"] = {
                    "name": f"{sr['rdma_prefix']}{sr['rdma_base'] + n}",
                    "link_layer": sr["link_layer"],
                    "rate": sr["rate"],
                }
            vfdir = self.pci(spec, parent, cpus, all_cpus)
            self.link(vfdir / "physfn", pfdir)
            self.link(pfdir / f"virtfn{n}", vfdir)


def build(topology: str | dict[str, Any], out: str | Path) -> Path:
    """Build ``topology`` (name, YAML path or parsed dict) into directory ``out``; return its path."""
    topo = load_topology(topology) if isinstance(topology, str) else topology
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    b = Builder(root)
    nodes = topo.get("numa", [{"id": 0, "cpulist": topo.get("cpus", "0"), "distance": "10"}])
    b.numa(nodes)
    cpus = {n["id"]: n["cpulist"] for n in nodes}
    all_cpus = topo.get("cpus", ",".join(n["cpulist"] for n in nodes))
    if topo.get("rdma_cm", True):
        b.write("devices/virtual/misc/rdma_cm/dev", "10:58")
        b.link("class/misc/rdma_cm", "devices/virtual/misc/rdma_cm")
    for spec in topo.get("pci", []):
        b.pci(spec, cpus=cpus, all_cpus=all_cpus)
    for spec in topo.get("netdevs", []):  # non-PCI netdevs: virtual or e.g. on VMBus
        parent = Path(spec.get("parent", "devices/virtual"))
        if spec.get("parent"):
            (root / parent).mkdir(parents=True, exist_ok=True)
        b.netdev(parent, spec, device_link=bool(spec.get("parent")))
    for spec in topo.get("soft_rdma", []):  # rxe/siw on a netdev above
        b.soft_rdma(spec)
    b.finish_masters()
    return root


def main(argv: list[str] | None = None) -> int:
    """CLI: build one topology into a directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", required=True, help=f"one of {', '.join(topologies())} or a YAML path")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        print(build(args.topology, args.out))
    except (ValueError, KeyError, OSError, yaml.YAMLError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
