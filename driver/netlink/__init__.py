"""The kernel's netlink: NICs moved between namespaces, configured, watched.

Owns one socket layer (``channel``: framing, sequence numbers, pipelined requests, acks) under
both raw clients, ``rtnl`` (NETLINK_ROUTE) and ``ethtool`` (generic netlink); ``namespaces``
opens their sockets inside a network namespace; ``nic_moves`` records, moves, configures and
restores NICs; ``link_watch`` turns link events into rescan requests.

May import: ``driver.config`` only (and pyroute2 for slow-path dumps and the link watch).
"""
