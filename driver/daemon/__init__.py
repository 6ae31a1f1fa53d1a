"""``dranet run``: the node daemon, every component in one asyncio loop.

- :mod:`driver.daemon.command`: the ``dranet run`` entry point (flag checks, checkpoint load,
  signals).
- :mod:`driver.daemon.lifecycle`: :class:`~driver.daemon.lifecycle.Daemon`, which builds the
  components (the DRA kit's helper over the network driver, probe server, NRI plugin), starts them in
  order and stops them in the order a rolling update needs.
- :mod:`driver.daemon.device_sync`: the inventory, kept current by full scans and by link
  events, one device each.
- :mod:`driver.daemon.supervisor`: background components run under a guard that restarts them
  with backoff, so none can take the kubelet's socket down.

While an NRI hook runs, background work waits; blocking work (sysfs walks, netlink dumps) runs in
a worker thread so gRPC calls are answered meanwhile.

May import: every package below it that it wires: ``driver.dra``, ``driver.health``,
``driver.nri``, ``driver.claims``, ``driver.checkpoint``,
``driver.inventory``, ``driver.kube``, ``driver.netlink``, ``driver.node_lease``,
``driver.metrics``, ``driver.model`` and ``driver.config``; never ``driver.cli`` or
``driver.webhook``.
"""
