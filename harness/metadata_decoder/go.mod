module dranet.test/metadata-decoder

go 1.24

require (
	k8s.io/dynamic-resource-allocation v0.37.2
	tags.cncf.io/container-device-interface v1.1.1
)
