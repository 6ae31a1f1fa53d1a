"""A pod's network namespace as the hooks see it: its path in the sandbox, alive or not, held open.

The runtime names the namespace in the sandbox (:func:`pod_netns_path`); a stopped sandbox's is
unmounted, then removed (:func:`netns_alive`); while the pod holds NICs of ours the hooks keep an
fd of it open (:class:`NetnsPins`), so they can still be given back when no StopPodSandbox comes.
"""

from __future__ import annotations

import os

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.netlink.namespaces import is_netns_fd


def pod_netns_path(pod: api.PodSandbox) -> str:
    """The pod's network namespace path, or "" for a hostNetwork pod."""
    for ns in pod.linux.namespaces:
        if ns.type == "network":
            return ns.path
    return ""


def netns_alive(path: str) -> bool:
    """Whether ``path`` is a network namespace (a stopped sandbox's is unmounted, then removed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return is_netns_fd(fd)
    finally:
        os.close(fd)


class NetnsPins:
    """Pod UID -> an open fd of the pod's network namespace, while the pod holds our NICs.

    An open fd keeps the namespace (and the NICs in it) alive after the runtime unmounts it, so
    NICs can still be given back when no StopPodSandbox reaches us: containerd (up to 2.3 at least)
    forgets its pods' NRI state on restart and then never relays Stop/Remove for pods created
    before it (containerd#8426); a destroyed namespace destroys a veth and drops a physical NIC on
    the host unconfigured. The kubelet's NodeUnprepareResources then returns them
    (:meth:`driver.nri.hooks.NRIHooks.claim_unprepared`).
    """

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def pin(self, pod_uid: str, netns: str) -> None:
        """Hold the pod's network namespace open (idempotent; a gone namespace is not pinned)."""
        if pod_uid in self.fds or not netns:
            return
        try:
            fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        if is_netns_fd(fd):
            self.fds[pod_uid] = fd
        else:
            os.close(fd)

    def unpin(self, pod_uid: str) -> None:
        """Let the pod's namespace go (its NICs are home)."""
        fd = self.fds.pop(pod_uid, None)
        if fd is not None:
            os.close(fd)

    def path(self, pod_uid: str, netns: str) -> str:
        """The pinned namespace (as a /proc/self/fd path) when we hold one, else ``netns``."""
        fd = self.fds.get(pod_uid)
        return f"/proc/self/fd/{fd}" if fd is not None else netns
