"""ResourceClaims on this node: preparing them with their ``dra.net`` config, and reporting back.

What is done with a config decoded by the config language (``driver.api.v1alpha1``): ``prepare``
(NodePrepareResources: each claim's record built once by ``claim_build``, stored typed through one
group commit), ``numa_pinning`` and ``container_settings`` (what a container gets), ``status``
and ``numa_report`` (the claim's ``status.devices``), ``profile`` (a named profile resolved by the
profile provider and merged under the claim's config at prepare, released at unprepare).

May import: ``driver.dra`` (the kubelet's claim references and answers), ``driver.api``,
``driver.checkpoint``, ``driver.kube``, ``driver.netlink`` (prepare's MTU check),
``driver.nic_settings`` (each setting's check of a config against the NIC),
``driver.profiles`` (``profile``: the profile provider's config for a NIC),
``driver.inventory`` (the PCIe topology and the attributes' ranks of the device metadata),
``driver.model``, ``driver.config``. Never the NRI, health or daemon packages.
"""
