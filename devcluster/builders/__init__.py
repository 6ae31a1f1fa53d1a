"""Building what the dev cluster runs, cached outside the work tree: etcd and Kubernetes from their Go
modules, containerd, runc and the CNI plugins, CRI-O, helm, registry-free images and the driver's image."""
