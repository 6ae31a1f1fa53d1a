"""Reusable test helpers: a fake kube-apiserver and a client that plays the kubelet."""
