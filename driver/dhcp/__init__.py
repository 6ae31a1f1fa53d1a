"""DHCPv4 for ``interface.dhcp: true``: one lease taken on a NIC inside a pod's namespace, released at its return.

``wire`` builds and parses the messages (RFC 2131/2132, classless routes of RFC 3442; pure, no
I/O); ``client`` runs the exchange (DISCOVER, OFFER, REQUEST, ACK) and the DHCPRELEASE over a UDP
socket created inside the pod's network namespace and bound to the NIC, within a deadline that
fits the NRI hook. Why a small client of our own and not a library: docs/configuration.md, DHCP.

May import: ``driver.netlink`` (its socket layer, to enter a pod's netns).
"""
