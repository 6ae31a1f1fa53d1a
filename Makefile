# The two commands a newcomer needs:  make demo   and   make test
PY ?= python3
export PIP_DISABLE_PIP_VERSION_CHECK=1

.PHONY: deps demo test protos bench binaries chart-oci

deps:  ## install the project and its test dependencies (system packages too)
	bash hack/install-deps.sh

binaries: deps  ## build or reuse etcd, kube-apiserver, scheduler, controller-manager, helm, NRI harness
	$(PY) -m devcluster.binaries --all
	$(PY) -m devcluster.helm
	$(PY) -c "from tests.plugins.nri import harness_binary; print('nri harness:', harness_binary())"

demo: binaries  ## a real control plane, the driver on a simulated ND H100 v5 node, the seed example allocated
	$(PY) -m devcluster.demo

test: binaries  ## every test
	$(PY) -m pytest -q -p no:cacheprovider

protos:  ## regenerate dranet_proto stubs after editing a .proto
	$(PY) hack/gen_protos.py

bench: deps  ## benchmarks (prints medians, p99s, ratios)
	$(PY) -m bench

chart-oci: deps  ## package charts/dranet as a Helm OCI artifact in an OCI image layout: build/chart-oci/
	rm -rf build/chart-oci build/chart
	$(PY) -m devcluster.helm
	"$$($(PY) -c 'from devcluster import helm; print(helm.existing())')" package charts/dranet -d build/chart
	$(PY) hack/chart-oci.py build/chart/dranet-*.tgz build/chart-oci
