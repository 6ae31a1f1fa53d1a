"""The demos of the README: the training example allocated on a simulated node (``--allocation-only``), and
its experiment run to the end on a local cluster with real nodes (``python -m devcluster.demo``)."""
