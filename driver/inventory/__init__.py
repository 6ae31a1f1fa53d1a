"""What this node has: devices discovered from sysfs, netlink facts and RDMA, turned into
published attributes.

``discovery.Scanner`` is the pipeline (``sysfs``, ``netlink_facts``, ``rdma``, ``names``,
``attributes``) and ``device_builder`` builds each device it finds; ``scan_replay`` lets a
rescan skip the pipeline when none of its inputs changed; ``incremental`` rebuilds the one
device a link event feeds; ``device_filter`` applies the admin's CEL filter (``dranet_filter``:
the Go driver's syntax of it); ``topology`` and ``discovery_cli`` serve
``dranet topology|templates|discover``.

May import: ``driver.model``, ``driver.api`` (the cloud providers' typed configs),
``driver.netlink`` (the socket layer, the one link parser and the eBPF attachments),
``driver.config``.
"""
