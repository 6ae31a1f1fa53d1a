"""The kernel's netlink: NICs moved between namespaces, configured, watched.

Two raw clients on the socket layer of :mod:`driver.netlink_channel`: ``rtnl`` (NETLINK_ROUTE)
and ``ethtool_genl`` (generic netlink, ethtool family; ``ethtool`` resolves and applies a claim's
``ethtool`` section with it); ``namespaces`` opens their sockets inside a network namespace;
``nic_moves`` records, moves, configures and restores NICs; ``link_watch`` turns link events into
batches of (kind, ifindex, name); ``own_changes`` is how the NRI hooks announce the links they
change (and that they are running), so their own events cost nothing.

May import: ``driver.netlink_channel`` (the socket layer and rtnetlink vocabulary) and ``driver.config``.
"""
