"""What a DRA driver gives the kit, and the values that cross between them.

A driver implements :class:`DRADriver`: ``prepare`` and ``unprepare`` answer the kubelet's
NodePrepareResources / NodeUnprepareResources claim by claim (Go's ``kubeletplugin.DRAPlugin``;
with ``prepare_now``/``unprepare_now`` too, :class:`BlockingPreparer`, on the server's thread),
``devices`` is what its ResourceSlices list (Go's ``resourceslice.DriverResources``), ``health``
says how each published device is. The kit calls them; it never looks inside a device beyond
:class:`SliceDevice`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepare/NodeUnprepare requests."""

    namespace: str
    name: str
    uid: str


@dataclass
class ResultDevice:
    """One device of a prepared claim, as returned to the kubelet."""

    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str] = field(default_factory=list)
    share_id: str | None = None


@dataclass
class PrepareResult:
    """Per-claim outcome: devices, or a non-empty error (then devices are ignored)."""

    devices: list[ResultDevice] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True, slots=True)
class DeviceHealthState:
    """Health of one published device as streamed to the kubelet (and tainted in the slice)."""

    pool: str
    device: str
    healthy: bool
    message: str  # why it is unhealthy, or a note for the kubelet's health message
    reason: str = ""  # when unhealthy: a short word (a label value), the value of the device's taint


class SliceDevice(Protocol):
    """A device as a ResourceSlice lists it: a unique name and its ``spec.devices[]`` entry."""

    @property
    def name(self) -> str: ...

    def to_api(self) -> dict[str, Any]:
        """The v1 ``spec.devices[]`` entry (name, attributes, ...), without taints."""
        ...


D = TypeVar("D", bound=SliceDevice)
D_co = TypeVar("D_co", bound=SliceDevice, covariant=True)


class ClaimPreparer(Protocol):
    """The kubelet's two calls; every claim gets its own answer, a call never fails as a whole."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        """Claim UID -> its devices or its error, for every claim asked."""
        ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Claim UID -> error ("" for success), for every claim asked."""
        ...


class BlockingPreparer(ClaimPreparer, Protocol):
    """A driver that can answer the kubelet on the DRA server's thread, start to end, without the
    event loop: the kit calls these (a call then costs no hand-off between threads)."""

    def prepare_now(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        """As :meth:`prepare`, blocking the calling thread."""
        ...

    def unprepare_now(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """As :meth:`unprepare`, blocking the calling thread."""
        ...


class DRADriver(ClaimPreparer, Protocol[D_co]):
    """Everything the kit needs from a driver: the kubelet's calls, its devices, their health."""

    def devices(self) -> Sequence[D_co]:
        """The devices to publish now (read when the driver says they changed, see ``Helper.devices_changed``)."""
        ...

    def counter_sets(self, devices: Sequence[SliceDevice]) -> Sequence[Mapping[str, Any]]:
        """The shared counters (v1 ``CounterSet`` entries) that ``devices`` (what :meth:`devices` gave)
        consume from: devices published as partitions of one (KEP-4815); empty for none."""
        ...

    def device_taints(self, devices: Sequence[SliceDevice]) -> Mapping[str, Sequence[Mapping[str, Any]]]:
        """Taints ``devices`` carry for what they are, not for their health (device -> its v1
        ``DeviceTaint`` entries, each with a ``timeAdded`` that stays the same while it lasts);
        published with the health taints where the apiserver keeps taints; empty for none."""
        ...

    async def health(self) -> list[DeviceHealthState]:
        """The health of every published device now (called every health interval and when poked)."""
        ...
