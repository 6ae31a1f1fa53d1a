"""The CreateContainer answer: RDMA character devices, NCCL environment and the NUMA cpuset.

:func:`container_adjustment` turns a pod's prepared devices and the
:class:`~driver.claims.container_settings.ContainerSettings` of their claim configs into the NRI
``ContainerAdjustment`` the runtime applies to the container; :func:`without_stay_home_rdma` is
the pod's devices as a container sees them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import MovedDevice, PreparedDevice
from driver.claims.container_settings import ContainerSettings
from driver.model.device import CharDevice
from driver.nic_settings import rdma

RDMA_CM = "/dev/infiniband/rdma_cm"  # connection manager: every RDMA consumer needs it, no device owns it


def container_adjustment(
    devices: Sequence[PreparedDevice],
    settings: ContainerSettings | None = None,
) -> api.ContainerAdjustment | None:
    """The CreateContainer adjustment for a pod's devices, or None when there is nothing to add.

    RDMA char devices (deduplicated by path), plus ``settings`` from the claim config: the
    exact HCAs as ``NCCL_IB_HCA``/``DRANET_RDMA_DEVICES`` and the NUMA cpuset when pinning.
    """
    adjust = api.ContainerAdjustment()
    seen: set[str] = set()
    for dev in devices:
        host = dev.snapshot.host
        if dev.vfio or (not host.rdma_device and not host.char_devices):
            continue  # a VF on vfio-pci: its VFIO devices come from its CDI device
        chars = list(host.char_devices)
        if host.rdma_device and not any(c.path.endswith("/rdma_cm") for c in chars):
            rdma_cm = _stat_char(RDMA_CM)
            if rdma_cm is not None:
                chars.append(rdma_cm)
        for char in chars:
            if char.path in seen:
                continue
            seen.add(char.path)
            linux_dev = adjust.linux.devices.add(path=char.path, type=char.type, major=char.major, minor=char.minor)
            linux_dev.file_mode.value = 0o666
    if settings is not None:
        for key, value in sorted(settings.env.items()):
            adjust.env.add(key=key, value=value)
        if settings.cpuset is not None:
            adjust.linux.resources.cpu.cpus = settings.cpuset.cpus
            adjust.linux.resources.cpu.mems = settings.cpuset.mems
    return adjust if adjust.ByteSize() else None


def without_stay_home_rdma(devices: Sequence[PreparedDevice], moved: Sequence[MovedDevice]) -> list[PreparedDevice]:
    """``devices`` as a container sees them: a NIC whose RDMA device could not come into the pod
    (a soft one the move destroyed) has no RDMA device there, so no char devices and no HCA; one
    whose soft device was made again in the pod has that one's char devices (new numbers), and a
    share the name of its own."""
    out = list(devices)
    stayed = {m.device for m in moved if rdma.stays_home(m.records.get(rdma.RdmaDevice.name))}
    remade = {
        m.device: (record["soft"], record["char_devices"])
        for m in moved
        if isinstance(record := m.records.get(rdma.RdmaDevice.name), dict)
        and rdma.made_in_pod(record)
        and record.get("char_devices")
    }
    for i, d in enumerate(out):
        if d.device in stayed and d.snapshot.host.rdma_device:
            host = replace(d.snapshot.host, rdma_device=None, char_devices=[])
            out[i] = replace(d, snapshot=replace(d.snapshot, host=host))
        elif d.device in remade and d.snapshot.host.rdma_device:
            name, made = remade[d.device]
            chars = [CharDevice(path=c["path"], major=c["major"], minor=c["minor"]) for c in made]
            host = replace(d.snapshot.host, rdma_device=name, char_devices=chars)
            out[i] = replace(d, snapshot=replace(d.snapshot, host=host))
    return out


def _stat_char(path: str) -> CharDevice | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return CharDevice(path=path, major=os.major(st.st_rdev), minor=os.minor(st.st_rdev))
