# The two commands a newcomer needs:  make demo   and   make test
PY ?= python3
export PIP_DISABLE_PIP_VERSION_CHECK=1

.PHONY: deps demo demo-fast test test-oldest-k8s test-dranet-ip-families guest-node soak test-torch protos schema module-table bench bench-hooks bench-scale bench-mpijob binaries up down chart-oci image

deps:  ## install the project and its test dependencies (system packages too)
	@mkdir -p build && date +%s > build/.binaries-started
	bash hack/install-deps.sh

binaries: deps  ## build or reuse the control plane, the nodes (kubelet, containerd, CRI-O), CoreDNS, the MPI Operator and the images
	$(PY) -m devcluster.builders.binaries --all
	$(PY) -m devcluster.builders.components
	$(PY) -m devcluster.builders.crio
	$(PY) -m devcluster.cluster.coredns
	$(PY) -m devcluster.builders.helm
	$(PY) -c "from harness.nri import harness_binary; print('nri harness:', harness_binary())"
	$(PY) -m devcluster.builders.images
	$(PY) -m devcluster.builders.driver_image
	$(PY) -m devcluster.cluster.mpi_operator
	$(PY) -m devcluster.cluster.mpijobs
	$(PY) -m devcluster.builders.stock_kernel "" bullseye trixie trixie-backports
	$(PY) -m devcluster.builders.qemu
	@echo "[binaries] dependencies and every component ready in $$(( $$(date +%s) - $$(cat build/.binaries-started) )) s (cached under $${DRANET_CACHE_DIR:-~/.cache/dranet})"

demo: binaries  ## two real nodes: the training example's MPIJobs run to MFU_RESULT over their claimed NICs
	$(PY) -m devcluster.demo

demo-fast: binaries  ## allocation only (no kubelet): which NICs and GPUs each claim gets
	$(PY) -m devcluster.demo --allocation-only

up: binaries  ## a local cluster with two real nodes, left running (prints KUBECONFIG= and KUBECTL=)
	$(PY) -m devcluster up

down:  ## remove everything `make up` started
	$(PY) -m devcluster down

test: binaries  ## every test, in tiers on two lanes, with a table of each tier's count and seconds (torch-only tests deselected: they need the 5 GB [example] extra; docs/testing.md)
	$(PY) hack/test_tiers.py

test-oldest-k8s:  ## the real-node e2e suite on the oldest supported Kubernetes (v1.34)
	DRANET_K8S_VERSION=$${DRANET_K8S_VERSION:-v1.34.10} $(MAKE) binaries
	DRANET_K8S_VERSION=$${DRANET_K8S_VERSION:-v1.34.10} $(PY) -m pytest -q -p no:cacheprovider -m "not torch" tests/e2e/node

test-dranet-ip-families: binaries  ## dranet's e2e suite on an IPv4, an IPv6-only and a dual-stack node (make test: IPv4)
	DRANET_E2E_DRANET_IP_FAMILIES=ipv4,ipv6,dual $(PY) -m pytest -q -p no:cacheprovider tests/e2e/node/test_dranet_e2e_cluster.py

guest-node: binaries  ## a real node (containerd, kubelet, the driver) on Linux 7.3 under QEMU: RDMA between two of its pods (docs/testing.md)
	$(PY) -m devcluster.guest_node

soak: binaries  ## long churn: 20 create/delete cycles of the seed's two-worker MPIJob (and 200 pod cycles)
	DRANET_MPI_CHURN_CYCLES=20 $(PY) -m pytest -q -p no:cacheprovider tests/e2e/node/test_mpi_churn.py tests/e2e/node/test_churn.py

test-torch: deps  ## the CPU benchmark tests that need torch (installs the [example] extra)
	$(PY) -m pip install -q --root-user-action=ignore -e '.[example]'
	$(PY) -m pytest -q -p no:cacheprovider -m torch

protos:  ## regenerate dranet_proto stubs after editing a .proto
	$(PY) hack/gen_protos.py

schema:  ## regenerate the claim config JSON Schema (charts/dranet/files/) after editing driver/api
	$(PY) hack/gen_schema.py

module-table:  ## regenerate docs/architecture.md's module table from the driver's docstrings
	$(PY) hack/gen_module_table.py

bench: deps  ## benchmarks (prints medians, p99s, ratios)
	$(PY) -m bench

chart-oci: deps  ## package charts/dranet as a Helm OCI artifact in an OCI image layout: build/chart-oci/
	rm -rf build/chart-oci build/chart
	$(PY) -m devcluster.builders.helm
	"$$($(PY) -c 'from devcluster import helm; print(helm.existing())')" package charts/dranet -d build/chart
	$(PY) hack/chart-oci.py build/chart/dranet-*.tgz build/chart-oci

image: deps  ## the driver image from the Dockerfile (buildah, no Docker engine) as an OCI image layout: build/image-oci/
	$(PY) -m devcluster.builders.driver_image --oci-layout build/image-oci --tag "$$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' charts/dranet/Chart.yaml)"

bench-mpijob: binaries  ## MPIJob apply -> workers Ready / first rank, with NIC claims vs without (two real nodes)
	$(PY) -m bench.bench_mpijob_start

bench-hooks: binaries  ## pod start/stop through the whole daemon vs the bare kernel work (root; docs/performance.md)
	$(PY) -m bench.bench_hooks
	$(PY) -m bench.bench_discovery --cli-runs 3

bench-scale: binaries  ## the scheduler against 500-1000 simulated GPU nodes, and each driver's API load (minutes; root for the storm)
	$(PY) -m bench.bench_cluster_scale --nodes 500,1000 --profile 20
	$(PY) -m bench.bench_apiserver_load
