"""ResourceClaims on this node: their ``dra.net`` config, preparing them, and reporting back.

The config language, pure and light (the webhook imports only this part): ``fields`` (strict
JSON readers, ``ConfigError``), ``decode`` (one opaque config), ``merge`` (which configs apply to
a request, in DRA order), ``validation`` (whole claims, for the webhook and ``dranet validate``).
Then what is done with a decoded config: ``prepare`` (NodePrepareResources: each claim's record
built once by ``claim_build``, stored typed through ``group_commit``), ``numa_pinning`` and
``container_settings`` (what a container gets), ``status`` and ``numa_report`` (the claim's
``status.devices``), ``profile`` (a named profile resolved by the profile provider and merged
under the claim's config at prepare, released at unprepare).

May import: ``driver.checkpoint``, ``driver.kube``, ``driver.netlink`` (prepare's ethtool check),
``driver.profiles`` (``profile``: the profile provider's config for a NIC),
``driver.model``, ``driver.config``. Never the kubelet, NRI or publish packages.
"""
