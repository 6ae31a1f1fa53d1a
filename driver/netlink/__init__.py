"""The kernel's netlink: NICs moved between namespaces, configured, watched.

Owns one socket layer (``channel``: framing, sequence numbers, pipelined requests, acks) under
both raw clients, ``rtnl`` (NETLINK_ROUTE) and ``ethtool`` (generic netlink); ``namespaces``
opens their sockets inside a network namespace; ``nic_moves`` records, moves, configures and
restores NICs; ``link_watch`` turns link events into rescan requests.

May import: ``driver.netlink_channel`` (the socket layer and rtnetlink vocabulary) and ``driver.config``.
"""
