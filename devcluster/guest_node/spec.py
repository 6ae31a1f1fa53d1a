"""What the host half and the guest half of a guest node agree on: addresses, the run folder's
files, the spec the host writes, the pods' manifests."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from devcluster.builders.components import NodeBinaries

GUEST_IP = "10.0.2.15"
HOST_FROM_GUEST = "10.0.2.2"
"""QEMU's user network: the guest's address, and the host's loopback as the guest sees it (the
apiserver listens on 127.0.0.1 and is reached there; its serving certificate names it)."""
GUEST_DNS = "10.0.2.3"
UPLINK_MAC = "52:54:00:99:00:01"
CONTROL = "control"
"""Requests of the host (``cmd-<n>``) and the guest's answers (``done-<n>``), in the run folder."""
RESULTS = "results"
"""What the pods write, in the run folder (mounted in each pod at :data:`SHARED`)."""
SHARED = "/shared"
RAIL_SUBNET = "10.77.0"
RAIL_MACS = ("52:54:00:00:00:00", "52:54:00:00:01:00")
"""The two NICs on rail 0 (NIC 0 of NUMA node 0 and of NUMA node 1, one QEMU hub): the pods' NICs,
wired to each other. NIC 1 of each node is on rail 1, claimed by nobody."""
POD_LIBS = "/usr/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu/libibverbs"
BW_ITERS = 500
"""``ib_write_bw`` of 64 KiB messages: 32 MiB a run, a few seconds emulated."""


@dataclass
class GuestSpec:
    """The host half's instructions to the guest half (``spec.json`` in the run folder)."""

    node_name: str
    layout_name: str
    images: list[tuple[str, str]]  # (reference, docker archive) imported into containerd
    node_binaries: dict[str, str]
    dns: str = GUEST_DNS
    driver_timeout_s: float = 180.0

    def binaries(self) -> NodeBinaries:
        return NodeBinaries(**{k: Path(v) for k, v in self.node_binaries.items()})

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> GuestSpec:
        raw = json.loads(path.read_text())
        raw["images"] = [tuple(i) for i in raw["images"]]
        return cls(**raw)

    @classmethod
    def of(cls, node_name: str, layout_name: str, images: list[tuple[str, str]], nb: NodeBinaries) -> GuestSpec:
        return cls(node_name, layout_name, images, {k: str(v) for k, v in asdict(nb).items()})


def link_counters() -> dict[str, dict[str, int]]:
    """rx and tx bytes of every link of the calling namespace (its sysfs)."""
    out = {}
    for d in sorted(Path("/sys/class/net").iterdir()):
        try:
            out[d.name] = {k: int((d / "statistics" / f"{k}_bytes").read_text()) for k in ("rx", "tx")}
        except (OSError, ValueError):
            continue
    return out


@dataclass(frozen=True)
class PodPair:
    """The two pods of one round and their claims: the server on rail 0's NIC of NUMA node 0, the
    client on NUMA node 1's, each with a static address on the rail (claim config)."""

    round: int
    device_class: str = "dranet.net"
    node_name: str = ""
    image: str = ""
    roles: tuple[str, ...] = field(default=("server", "client"))
    attempt: int = 1  # a round run again gets pods, claims and a results folder of its own

    @property
    def tag(self) -> str:
        return str(self.round) if self.attempt == 1 else f"{self.round}-{self.attempt}"

    def name(self, role: str) -> str:
        return f"rdma-{role}-{self.tag}"

    def address(self, role: str) -> str:
        return f"{RAIL_SUBNET}.{1 + self.roles.index(role)}"

    def manifests(self) -> list[dict[str, object]]:
        docs: list[dict[str, object]] = []
        for role, mac in zip(self.roles, RAIL_MACS, strict=True):
            docs.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": self.name(role)},
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "nic",
                                    "exactly": {
                                        "deviceClassName": self.device_class,
                                        "selectors": [
                                            {
                                                "cel": {
                                                    "expression": 'device.attributes["dra.net"].rdma == true && '
                                                    f'device.attributes["dra.net"].mac == "{mac}"'
                                                }
                                            }
                                        ],
                                    },
                                }
                            ],
                            "config": [
                                {
                                    "requests": ["nic"],
                                    "opaque": {
                                        "driver": "dra.net",
                                        "parameters": {
                                            "interface": {"name": "rail0", "addresses": [f"{self.address(role)}/24"]}
                                        },
                                    },
                                }
                            ],
                        }
                    },
                }
            )
            docs.append(self.pod(role))
        return docs

    def pod(self, role: str) -> dict[str, object]:
        # The host's tools and libraries (merged /usr: the loader's path is /lib64's link into /lib).
        host_dirs = {"usr": ("/usr", "/usr"), "lib": ("/usr/lib", "/lib"), "lib64": ("/usr/lib64", "/lib64"),
                     "verbs": ("/etc/libibverbs.d", "/etc/libibverbs.d")}  # fmt: skip
        mounts = [{"name": k, "mountPath": inside, "readOnly": True} for k, (_, inside) in host_dirs.items()]
        mounts.append({"name": "shared", "mountPath": SHARED})
        volumes = [{"name": k, "hostPath": {"path": outside}} for k, (outside, _) in host_dirs.items()]
        volumes.append({"name": "shared", "hostPath": {"path": "/run/guest"}})
        peer, folder = self.address("server"), f"{SHARED}/{RESULTS}/{self.tag}"
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name(role), "labels": {"app": "rdma-pair"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": self.node_name},
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "nic", "resourceClaimName": self.name(role)}],
                "containers": [
                    {
                        "name": role,
                        "image": self.image,
                        "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", pod_script(role, f"{folder}/{role}", peer, f"{folder}/server")],
                        "env": [{"name": "LD_LIBRARY_PATH", "value": POD_LIBS}],
                        "resources": {"claims": [{"name": "nic"}]},
                        "volumeMounts": mounts,
                    }
                ],
                "volumes": volumes,
            },
        }

    def yaml(self) -> str:
        return yaml.safe_dump_all(self.manifests(), sort_keys=False)


LISTEN_WAIT_S = 120
"""How long the client waits for the server to listen, and each server tool for its client."""


def pod_script(role: str, out: str, peer: str, server_out: str) -> str:
    """What each pod runs: its view (RDMA devices, char devices, addresses, environment), then
    ``ib_write_bw``, ``ib_send_lat`` (both over rdma_cm) and ``rping`` against the other pod. Each
    tool's output and exit status go to ``out``. The server marks each tool ``<tool>.listening`` in
    ``server_out`` once the kernel lists its rdma_cm listen (``rdma resource show cm_id``); the
    client starts each tool only then, and tries again (ten times at most) only if it still fails,
    each try's output kept. No tool outlives :data:`LISTEN_WAIT_S` waiting for the other side."""
    q = shlex.quote
    tools = [
        ("ib_write_bw", f"ib_write_bw -d $dev -R -s 65536 -n {BW_ITERS} -p 18515", 18515),
        ("ib_send_lat", "ib_send_lat -d $dev -R -n 200 -p 18516", 18516),
        ("rping", "rping -v -C 10 -p 18517", 18517),
    ]
    lines = [
        'export PATH="$PATH:/usr/bin:/usr/sbin"',  # the image's busybox, then the host's tools
        f"out={q(out)}; srv={q(server_out)}; mkdir -p $out",
        "dev=${DRANET_RDMA_DEVICES%%,*}",
        "ls /dev/infiniband > $out/chardevs.txt 2>&1",
        "ls /sys/class/infiniband > $out/sysfs-devices.txt 2>&1",
        "ip -o addr > $out/addresses.txt 2>&1",
        "env | grep -E '^(DRANET|NCCL|UCX)_' | sort > $out/env.txt",
    ]
    wait = LISTEN_WAIT_S
    for name, cmd, port in tools:
        if role == "server":
            run = f"{cmd} -s -a 0.0.0.0" if name == "rping" else cmd
            lines += [
                f"timeout {wait} {run} > $out/{name}.txt 2>&1 & pid=$!",
                f"n=0; until rdma resource show cm_id 2>/dev/null | grep -Eq 'state LISTEN.*:{port}( |$)'; do "
                f"n=$((n+1)); [ $n -ge {wait * 5} ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done",
                f"touch $srv/{name}.listening; wait $pid; echo $? > $out/{name}.rc",
            ]
        else:
            run = f"{cmd} -c -a {peer}" if name == "rping" else f"{cmd} {peer}"
            lines += [
                f"n=0; until [ -e $srv/{name}.listening ]; do n=$((n+1)); [ $n -ge {wait} ] && break; sleep 1; done",
                f'n=1; while :; do echo "--- try $n" >> $out/{name}.txt; '
                f"timeout {wait} {run} >> $out/{name}.txt 2>&1; rc=$?; "
                f"[ $rc -eq 0 ] || [ $n -ge 10 ] && break; n=$((n+1)); sleep 1; done; "
                f"echo $rc > $out/{name}.rc; echo $n > $out/{name}.tries",
            ]
    return "\n".join(lines) + "\n"
