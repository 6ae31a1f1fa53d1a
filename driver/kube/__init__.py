"""The Kubernetes API client: ``client.KubeClient`` (one method per call the driver makes, every
REST path), ``errors`` (typed: NotFound, Conflict, Forbidden, Unavailable), ``transport``
(kubeconfig, in-cluster, or the kubernetes package's ApiClient when needed).

May import: ``driver.model`` (the bounded JSON parser of the API server's answers).
"""
