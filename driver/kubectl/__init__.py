"""``kubectl dranet``: the cluster's NICs and GPUs, by node and NUMA node, from the API alone.

A kubectl plugin (the ``kubectl-dranet`` console script, installed with the package) for people
without a shell on the nodes: what each node publishes (:mod:`.cluster`), the local ``dranet
topology`` matrix and ``dranet templates`` rebuilt from ResourceSlices (:mod:`.topology`), what a
claim or a pod got (:mod:`.claims`) and whether the installation works (:mod:`.doctor`). It reads
only what a namespace user may: ResourceSlices, DeviceClasses and the namespace's own claims and
pods; what it may not read is reported as unknown, never guessed.

May import: ``driver.kube`` (the API client), ``driver.inventory`` (the topology matrix and
templates), ``driver.claims`` (the NUMA verdict), ``driver.netlink`` (the kernel floor the doctor
checks), ``driver.cli_flags``, ``driver.model`` and ``driver.config``.
"""
