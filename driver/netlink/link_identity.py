"""What tells a NIC from every other link, wherever it is: never its name or its MAC alone.

A pod with ``NET_ADMIN`` in its namespace can rename links, set any MAC and create links of its
own, so a name or a MAC found in a pod proves nothing. What it cannot change: the ifindex the
driver chose for the NIC in the pod (``IFLA_NEW_IFINDEX`` with the move: a link keeps its index
while it stays in one namespace), the permanent address a NIC driver burned in, the bus device
under a physical NIC (its PCI address), the link's kind, and, for a veth, that its peer is in
another namespace (a pod cannot reach one to put its own link's peer there).
:class:`LinkIdentity` holds those facts, read from netlink when the NIC moves;
:meth:`LinkIdentity.matches` tells whether a link found at the recorded index is still that NIC.
A NIC whose identity has neither a permanent address nor a parent (a virtual NIC) is never
searched for by anything but its recorded index: a veth dies with its namespace and cannot come
back, so nothing else can be it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from driver.netlink.link_info import LinkInfo


@dataclass(frozen=True)
class LinkIdentity:
    """The facts of a NIC that a pod cannot forge (see the module doc)."""

    permanent_mac: str | None = None
    parent: str | None = None
    kind: str | None = None
    # The pod's view of a veth's peer when the NIC moved in: (its ifindex, the netnsid of its
    # namespace); a link the pod made itself has its peer in the pod (no netnsid).
    peer: tuple[int, int] | None = None

    @classmethod
    def of(cls, link: LinkInfo, *, in_pod: bool = False) -> LinkIdentity:
        """The identity of ``link``; ``in_pod``: also its peer as the pod sees it."""
        peer = None
        if in_pod and link.peer is not None and link.peer_netnsid is not None:
            peer = (link.peer, link.peer_netnsid)
        return cls(link.permanent_mac, link.parent, link.kind, peer)

    @property
    def unforgeable(self) -> bool:
        """Whether the NIC can be recognised anywhere (a burned-in address or a bus device)."""
        return bool(self.permanent_mac or self.parent)

    def matches(self, link: LinkInfo, *, in_pod: bool = False) -> bool:
        """Whether ``link`` (found at the NIC's recorded index) is this NIC; ``in_pod``: compare the
        peer too (only the pod's view of it was recorded)."""
        if (link.permanent_mac or None) != self.permanent_mac or link.parent != self.parent or link.kind != self.kind:
            return False
        if in_pod and self.peer is not None:
            # Its peer still outside the pod. Where outside may change: the driver moves the other
            # end of a veth pair into another pod (dranet's PBR and VRF set-ups); a link the pod
            # made itself has its peer inside.
            return link.peer is not None and link.peer_netnsid is not None
        return True

    def recognises(self, link: LinkInfo) -> bool:
        """Whether ``link``, found anywhere, can only be this NIC (by its unforgeable facts)."""
        if not self.unforgeable:
            return False
        if self.permanent_mac and (link.permanent_mac or "").lower() != self.permanent_mac.lower():
            return False
        return not self.parent or link.parent == self.parent

    def to_dict(self) -> dict[str, Any]:
        """Checkpoint form (only what is set)."""
        out: dict[str, Any] = {}
        for key in ("permanent_mac", "parent", "kind"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.peer is not None:
            out["peer"] = list(self.peer)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> LinkIdentity:
        """Inverse of :meth:`to_dict`."""
        data = data or {}
        peer = data.get("peer")
        return cls(
            data.get("permanent_mac"),
            data.get("parent"),
            data.get("kind"),
            (int(peer[0]), int(peer[1])) if isinstance(peer, list) and len(peer) == 2 else None,
        )


def find_by_identity(links: Sequence[LinkInfo], identity: LinkIdentity) -> LinkInfo | None:
    """The one link of ``links`` (a namespace's dump) that only this NIC can be, or None."""
    found = [link for link in links if identity.recognises(link)]
    return found[0] if len(found) == 1 else None
