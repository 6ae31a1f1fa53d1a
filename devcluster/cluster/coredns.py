"""The cluster DNS: CoreDNS with its ``kubernetes`` plugin, built from its Go module.

Pods find each other by name the way they do on any cluster: the kubelet writes the cluster DNS
server into every pod's ``resolv.conf`` (``clusterDNS``, search ``<ns>.svc.cluster.local``...),
and CoreDNS answers from the API (Services, EndpointSlices, Pods), so the MPI Operator's
hostfile names (``<job>-worker-0.<job>.<ns>.svc``, a headless Service's per-pod records) resolve.

A cluster runs CoreDNS as a Deployment behind a Service VIP, which needs kube-proxy; here it is
a process on the host link's address (`NodeLayout.gateway`, port 53), which every pod reaches
over the pod network, with the Corefile of a kubeadm cluster (minus the VIP and metrics).
The binary holds only the plugins that Corefile uses: a ``main`` package in the wrapper module
that calls ``dnsserver.SetDirectives`` and imports those plugins (CoreDNS's documented way to
build a custom server), so the cold build compiles neither the cloud DNS providers nor etcd.

    python -m devcluster.cluster.coredns     # build (or reuse) and print the binary
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

from devcluster.builders.binaries import GoBuild, Progress, _print_progress, build_go_tool
from devcluster.cluster.node_config import CLUSTER_DOMAIN
from devcluster.cluster.node_layout import NodeLayout

MODULE = "github.com/coredns/coredns"
VERSION = "v1.15.0"
"""Newest CoreDNS on the module proxy; its go.mod: ``go 1.26.0``, client-go v0.37, no replace."""
# In plugin.cfg's execution order (the order of dnsserver.Directives matters).
PLUGINS = ("reload", "bind", "ready", "errors", "log", "loadbalance", "cache", "kubernetes", "forward")

_MAIN = """// The cluster DNS of the dranet dev cluster: CoreDNS with the plugins its Corefile uses.
package main

import (
	"log"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
{imports}
)

func init() {{
	if err := dnsserver.SetDirectives([]string{{{directives}}}); err != nil {{
		log.Fatal(err)
	}}
}}

func main() {{
	coremain.Run()
}}
"""


def main_go() -> str:
    """The wrapper module's main package."""
    imports = "\n".join(f'\t_ "{MODULE}/plugin/{p}"' for p in PLUGINS)
    return _MAIN.format(imports=imports, directives=", ".join(f'"{p}"' for p in PLUGINS))


def gomod(version: str = VERSION) -> str:
    return (
        "module example.invalid/coredns\n\ngo 1.26.0\n\n"
        "// upstream's own GODEBUG defaults\ngodebug default=go1.26\n\n"
        f"require {MODULE} {version}\n"
    )


def build(version: str = VERSION, progress: Progress = _print_progress) -> Path:
    """Build (or reuse) the binary; returns its path."""
    b = GoBuild(packages=(".",), output="coredns")
    bin_dir = build_go_tool(
        "coredns",
        version,
        gomod(version),
        [b],
        expect=("coredns",),
        progress=progress,
        extra_files={"main.go": main_go()},
    )
    return bin_dir / "coredns"


def corefile(layout: NodeLayout, ready_port: int) -> str:
    """kubeadm's Corefile, bound to the host link's address, reading the API with the admin
    kubeconfig (there is no in-cluster service account for a process)."""
    return f""".:53 {{
    bind {" ".join(layout.gateways)}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {layout.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    forward . /etc/resolv.conf
    cache 30
    loadbalance
}}
"""


def ready(ready_port: int) -> bool:
    """True once the ``kubernetes`` plugin has synced with the API (the ``ready`` plugin says so)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ready_port}/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def main() -> int:
    """CLI: build (or reuse) CoreDNS and print the binary."""
    t0 = time.monotonic()
    print(build())
    print(f"coredns ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
