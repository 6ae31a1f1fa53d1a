"""Reading a sysfs tree under a configurable root (``/sys`` on a host, a fixture dir in tests).

A :class:`SysfsReader` is made per scan and memoises every read, so one scan reads each
file and resolves each link at most once, and a file that changes mid-scan cannot give two
different answers to two parts of the same scan. All paths are relative to the root.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from dataclasses import dataclass, field

BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
"""An extended PCI bus address (``dddd:bb:dd.f``), as sysfs spells it."""

_UNSET: object = object()
"""Memo sentinel: None is a valid memoised answer (missing file or link)."""

PCIE_ROOT_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
"""A PCI host bridge directory name (``pci0000:00``), the standard ``pcieRoot`` value."""

READ_MAX = 65536
"""Bytes read from one sysfs file (attributes are at most a page)."""
ATTRIBUTE_MAX = 4096
"""The most a sysfs attribute holds (one page): a longer read is not an attribute file."""
QUIET_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EINVAL, errno.ENODATA, errno.EOPNOTSUPP, errno.ENODEV})
"""Read failures that mean "no value" in sysfs (``speed`` of a down link: EINVAL; a file that is
not there): not worth a warning. Anything else (EACCES, EIO, EISDIR, ELOOP, EAGAIN from a FIFO)
means a file that should be there cannot be read, and is reported."""
IFNAMSIZ = 16


def name_problem(name: str) -> str | None:
    """Why a sysfs object's name cannot be published (not UTF-8, control characters), or None."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "the name is not valid UTF-8"
    if not name.isprintable():
        return "the name has control characters"
    return None


def ifname_problem(name: str) -> str | None:
    """Why ``name`` (as ``os.listdir`` or netlink gives it) is not an interface name we can publish
    and move, or None. The kernel accepts any byte but NUL, ``/``, ``:`` and whitespace; we also need
    valid UTF-8 (names are published as API strings and sent back to netlink)."""
    problem = name_problem(name)
    if problem is not None:
        return problem
    raw = name.encode("utf-8")
    if not raw or len(raw) >= IFNAMSIZ:
        return f"the name is {len(raw)} bytes (1 to {IFNAMSIZ - 1})"
    if name in (".", "..") or any(c in "/:" or c.isspace() or not c.isprintable() for c in name):
        return "the name has characters an interface name cannot have"
    return None


def name_bytes(name: str | bytes) -> str:
    """A name as its bytes, for messages about names that are not valid text (``b'bad\\xff'``)."""
    return repr(os.fsencode(name))


def _failure(err: OSError) -> str | None:
    """None for a read failure that means "no value" in sysfs, else the problem to report."""
    if err.errno in QUIET_ERRNOS:
        return None
    return f"{err.strerror} ({errno.errorcode.get(err.errno or 0, '?')})"


ReadAnswer = bytes | str | None
"""What reading one attribute file gave: its content, a problem to report (text), or no value."""

IdentityKey = tuple[int, int, int]
"""``(st_dev, st_ino, st_ctime_ns)`` of a sysfs object's directory."""


class SysfsIO:
    """The reader's system calls, one method each (a subclass records them for a replay,
    :class:`driver.inventory.scan_replay.RecordingIO`). Paths are absolute.

    ``vouched`` (files and links): the answer cannot change while its object keeps its identity,
    which :class:`IdentityCache` checks with a stat that a replay repeats: a recording leaves
    the call out.
    """

    def read(self, path: str, vouched: bool = False) -> ReadAnswer:
        """One attribute file's content, a problem, or None (see :func:`open_read`)."""
        del vouched
        fd, answer = open_read(path)
        if fd is not None:
            os.close(fd)
        return answer

    def listdir(self, path: str) -> list[str]:
        """A directory's entries, sorted; empty when missing."""
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a directory (following links)."""
        return os.path.isdir(path)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (following links)."""
        return os.path.exists(path)

    def readlink(self, path: str, vouched: bool = False) -> str | int:
        """A symlink's target, or the errno (EINVAL: not a link; ENOENT: missing)."""
        del vouched
        try:
            return os.readlink(path)
        except OSError as err:
            return err.errno or errno.EIO

    def stat_key(self, path: str) -> IdentityKey | None:
        """The identity of the object at ``path`` (device, inode, ctime), or None when missing."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_ctime_ns)


def open_read(path: str) -> tuple[int | None, ReadAnswer]:
    """Open and read one attribute file: (the descriptor, still open, when it is a regular file
    that gave content; the answer). The answer is None when sysfs means "no value" (a missing
    file, ``speed`` of a down link), a problem text when a file that should be readable is not
    (or is not a regular file)."""
    try:
        # os.open/os.read: a third of the cost of open() for these tiny files. O_NONBLOCK:
        # a FIFO (or any device) where an attribute should be must never hang the scan.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        return None, _failure(err)
    try:
        data = os.read(fd, READ_MAX)
        # Only an empty or oversized answer is suspicious: one fstat, not one per file.
        mode = os.fstat(fd).st_mode if not data or len(data) > ATTRIBUTE_MAX else stat.S_IFREG
    except OSError as err:
        os.close(fd)
        return None, _failure(err)
    if not stat.S_ISREG(mode):
        os.close(fd)
        return None, "not a regular file"
    if not data:
        os.close(fd)
        return None, data
    return fd, data


PLAIN_IO = SysfsIO()


DirNames = tuple[tuple[str, frozenset[str]], ...]
"""Names by directory: (the directory's suffix to an object's path, the names in it)."""


def _by_dir(suffixes: list[str]) -> DirNames:
    names: dict[str, set[str]] = {}
    for path in suffixes:
        directory, _, name = path.rpartition("/")
        names.setdefault(directory, set()).add(name)
    return tuple((k, frozenset(v)) for k, v in names.items())


@dataclass(frozen=True, slots=True)
class ImmutableFacts:
    """Which files and links of one kind of sysfs object cannot change while the object exists:
    ``files`` by name, ``links`` by suffix (``""`` is the object's own link)."""

    files: tuple[str, ...] = ()
    links: tuple[str, ...] = ("",)
    # How a scan looks them up (:class:`Vouched`): one entry per directory, not one per fact.
    files_by_dir: DirNames = field(init=False, repr=False, compare=False)
    links_by_dir: DirNames = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files_by_dir", _by_dir([f"/{n}" for n in self.files]))
        object.__setattr__(self, "links_by_dir", _by_dir([x for x in self.links if x]))


@dataclass(slots=True)
class Vouched:
    """The reads of one scan whose answers :class:`IdentityCache` vouches for: files and links by
    directory (relative path) and name, and the objects whose own link is vouched for."""

    files: dict[str, frozenset[str]] = field(default_factory=dict)
    links: dict[str, frozenset[str]] = field(default_factory=dict)
    objects: set[str] = field(default_factory=set)

    def file(self, directory: str, name: str) -> bool:
        """Whether file ``name`` in ``directory`` is vouched for."""
        return name in self.files.get(directory, ())

    def link(self, rel: str) -> bool:
        """Whether link ``rel`` is vouched for."""
        if rel in self.objects:
            return True
        directory, _, name = rel.rpartition("/")
        return name in self.links.get(directory, ())

    def add(self, anchor: str, facts: ImmutableFacts) -> None:
        """From now on ``facts`` of the object at ``anchor`` are vouched for."""
        for table, by_dir in ((self.files, facts.files_by_dir), (self.links, facts.links_by_dir)):
            for suffix, names in by_dir:
                directory = anchor + suffix if suffix else anchor
                known = table.get(directory)
                table[directory] = names if known is None else known | names
        if "" in facts.links:
            self.objects.add(anchor)

    def remove(self, anchor: str, facts: ImmutableFacts) -> None:
        """Nothing of the object at ``anchor`` is vouched for (nor of another in the same directories)."""
        for table, by_dir in ((self.files, facts.files_by_dir), (self.links, facts.links_by_dir)):
            for suffix, _ in by_dir:
                table.pop(anchor + suffix if suffix else anchor, None)
        self.objects.discard(anchor)


@dataclass
class SysfsReader:
    """Memoising reader of one sysfs tree; create a new one for each scan."""

    root: str = "/sys"
    io: SysfsIO = PLAIN_IO
    problems: dict[str, str] = field(default_factory=dict)
    """Files that exist (or should) but could not be read this scan: relative path -> reason."""
    vouched: Vouched = field(default_factory=Vouched)
    """Files and links whose answers :class:`IdentityCache` vouches for this scan."""
    _files: dict[str, str | None] = field(default_factory=dict, repr=False)
    _links: dict[str, str | None] = field(default_factory=dict, repr=False)
    _dirs: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _real_dirs: dict[str, str | None] = field(default_factory=dict, repr=False)
    _link_names: dict[str, str | None] = field(default_factory=dict, repr=False)
    _raw: dict[str, ReadAnswer] = field(default_factory=dict, repr=False)
    data_direct: DataDirectIndex | None = field(default=None, repr=False)
    """This scan's ConnectX-8 Data Direct functions (:func:`data_direct_for`), found on first use."""

    def __post_init__(self) -> None:
        self.root = os.path.realpath(self.root)

    def path(self, rel: str) -> str:
        """The absolute path of ``rel`` under the root."""
        return f"{self.root}/{rel}" if rel else self.root

    def read(self, rel: str) -> str | None:
        """The stripped content of a file, or None when missing or unreadable (e.g. ``speed`` of a down link)."""
        # dict.get with a sentinel: a KeyError raised per miss costs more than the lookup itself.
        value = self._files.get(rel, _UNSET)
        if value is not _UNSET:
            return value  # type: ignore[return-value]
        directory, _, name = rel.rpartition("/")
        real_dir = self._real_dirs.get(directory, _UNSET)
        if real_dir is _UNSET:
            real_dir = self._real_dirs[directory] = self._fast_dir(directory)
        if real_dir is None:
            value = None
        else:
            value = self._read_file(rel, f"{real_dir}/{name}", self.vouched.file(directory, name))
        self._files[rel] = value
        return value

    def _read_file(self, rel: str, path: str, vouched: bool = False) -> str | None:
        """The stripped text of one file; None (and, unless sysfs means "no value", a recorded
        problem) when it cannot be read or is not a regular file."""
        answer = self.io.read(path, vouched)
        if isinstance(answer, str):
            self.problems[rel] = answer
            return None
        return None if answer is None else answer.decode("utf-8", "replace").strip()

    def _fast_dir(self, rel_dir: str) -> str | None:
        """Absolute path of directory ``rel_dir`` with its anchor link resolved; None when the anchor is missing.

        The anchor is ``bus/pci/devices/<BDF>`` or ``class/<cls>/<name>``. Below it sysfs has only
        real directories (plus links the kernel follows itself), so the kernel then walks no
        symlinks on open. Memoised per directory: each file read costs one dict lookup, not a
        re-split of its path.
        """
        parts = rel_dir.split("/", 4)
        if parts[0] == "bus" and len(parts) >= 4:
            anchor, rest = "/".join(parts[:4]), "/".join(parts[4:])
        elif parts[0] == "class" and len(parts) >= 3:
            anchor, rest = "/".join(parts[:3]), "/".join(parts[3:])
        else:
            return self.path(rel_dir)
        real = self.resolve(anchor)
        if real is None:
            return None
        return f"{self.root}/{real}/{rest}" if rest else f"{self.root}/{real}"

    def read_bytes(self, rel: str) -> ReadAnswer:
        """A binary file's bytes as they are (``vpd``), a problem text when it exists but cannot be
        read, or None when missing. Memoised; unlike :meth:`read` a problem is returned to the
        caller, not recorded in :attr:`problems` (binary files are optional facts)."""
        answer = self._raw.get(rel, _UNSET)
        if answer is _UNSET:
            directory, _, name = rel.rpartition("/")
            real_dir = self._fast_dir(directory)
            answer = None if real_dir is None else self.io.read(f"{real_dir}/{name}")
            self._raw[rel] = answer
        return answer  # type: ignore[return-value]

    def read_int(self, rel: str, base: int = 10) -> int | None:
        """A file parsed as an integer (``base`` 16 accepts a ``0x`` prefix), or None."""
        text = self.read(rel)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            return None

    def listdir(self, rel: str) -> list[str]:
        """Sorted entries of a directory, empty when missing."""
        if rel not in self._dirs:
            self._dirs[rel] = self.io.listdir(self.path(rel))
        return self._dirs[rel]

    def is_dir(self, rel: str) -> bool:
        """Whether ``rel`` resolves to a directory: False for a dangling or looping link (a phantom)."""
        real = self.resolve(rel)
        return real is not None and self.io.is_dir(self.path(real))

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists (following links)."""
        real = self.resolve(rel)
        return real is not None and self.io.exists(self.path(real))

    def resolve(self, rel: str) -> str | None:
        """The real path of ``rel`` relative to the root (links followed), or None when missing.

        Faster than ``os.path.realpath`` (one lstat per component, uncached): every component is
        resolved once per scan with one ``readlink`` and memoised, so ``class/net``, ``bus/pci/devices``
        and each device directory cost one syscall for the whole scan. Sysfs link targets are
        canonical relative paths, so one normalisation after each link is enough.
        """
        if not rel:
            return ""
        memo = self._links.get(rel, _UNSET)
        if memo is _UNSET:
            memo = self._links[rel] = self._resolve_once(rel)
        return memo  # type: ignore[return-value]

    def _in_real_dir(self, rel: str) -> str | None:
        """``rel`` with its directory part resolved, or None when that directory is missing."""
        head, _, tail = rel.rpartition("/")
        real_head = self.resolve(head) if head else ""
        if real_head is None:
            return None
        return f"{real_head}/{tail}" if real_head else tail

    def _resolve_once(self, rel: str) -> str | None:
        candidate = self._in_real_dir(rel)
        if candidate is None:
            return None
        real_head = candidate.rpartition("/")[0]
        target = self.io.readlink(self.path(candidate), self.vouched.link(rel))
        if isinstance(target, int):
            return candidate if target == errno.EINVAL else None  # EINVAL: not a link
        joined = os.path.normpath(f"{real_head}/{target}" if real_head else target)
        return None if joined.startswith("..") or os.path.isabs(target) else joined

    def link_name(self, rel: str) -> str | None:
        """The last component of a symlink's target (e.g. the driver name of ``.../driver``)."""
        if rel not in self._link_names:
            candidate = self._in_real_dir(rel)
            target = self.io.readlink(self.path(candidate)) if candidate is not None else errno.ENOENT
            self._link_names[rel] = None if isinstance(target, int) else os.path.basename(target)
        return self._link_names[rel]


def pci_address_of(real_path: str) -> str | None:
    """The nearest PCI function (BDF) in a resolved ``devices/...`` path, or None when not PCI."""
    for part in reversed(real_path.split("/")):
        if BDF_RE.match(part):
            return part
    return None


def pcie_root_of(real_path: str) -> str | None:
    """The host bridge (``pci<domain>:<bus>``) of a resolved PCI device path.

    The kernel layout puts it right under ``devices/``; on Hyper-V guests it sits deeper
    (under the VMBus device), so take the first component that looks like a host bridge.
    """
    for part in real_path.split("/"):
        if PCIE_ROOT_RE.match(part):
            return part
    return None


class IdentityCache:
    """Facts of sysfs objects that cannot change while the object exists, kept across scans.

    Each rescan (link events, resync) would otherwise re-read them for every device: on an SR-IOV
    host that is most of a scan's syscalls. Callers name, per kind of object, which files and
    links are immutable (:class:`ImmutableFacts`), e.g. a PCI function's ``class``/``vendor``/
    ``device``/``subsystem_device``/``sriov_totalvfs`` (read-only copies of config space taken at
    enumeration), its ``physfn`` and its place in the tree; an RDMA device's parent; a uverbs
    char device's ``dev`` numbers. Everything that can change at run time (driver binding,
    ``numa_node``, ``sriov_numvfs``, netdev files, port state, an RDMA device's name) is read by
    every scan.

    An entry is keyed by the object directory's ``(st_dev, st_ino, st_ctime_ns)``: kernfs gives
    every object a new inode number (generation included), so an object that is removed and
    added again (hotplug, SR-IOV disabled and re-enabled, driver reload) is read afresh. The
    check stats the directory's cached real path, not the class link (no symlink walk): a real
    path names the parent chain and the object's own name, so if the link now leads elsewhere
    (a renamed RDMA device) the old path is gone or holds a new object, and the stat misses.

    The scan that primes an object is told (``SysfsReader.vouched``) which of its reads the
    cache vouches for: a recording of that scan leaves them out, its replay repeats the stat.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Known] = {}
        self._seen: set[str] = set()
        # The tuples of file names and link suffixes, one object per distinct tuple (every PCI
        # function remembers the same few names: a node of 10k devices keeps them once).
        self._shapes: dict[tuple[str, ...], tuple[str, ...]] = {}

    def prime(self, sysfs: SysfsReader, anchor: str, facts: ImmutableFacts) -> IdentityKey | None:
        """Seed ``sysfs`` with what is known of ``anchor`` if it is still the same object; its key, or None.

        With a key, ``facts`` of ``anchor`` are vouched for in ``sysfs`` (those not known yet are
        read once, unrecorded, and kept by :meth:`remember`)."""
        self._seen.add(anchor)
        entry = self._entries.get(anchor)
        if entry is not None:
            key = sysfs.io.stat_key(sysfs.path(entry.real))
            if key == entry.key:
                sysfs._files.update(zip([f"{anchor}/{n}" for n in entry.files], entry.file_values, strict=True))
                sysfs._links.update(zip([anchor + x for x in entry.links], entry.link_values, strict=True))
                sysfs.vouched.add(anchor, facts)
                return key
        # A miss: the scan needs this link anyway. Vouched for before it is read (its answer is
        # kept by remember() once the stat gives a key)...
        fresh = anchor not in sysfs._links
        sysfs.vouched.add(anchor, facts)
        real = sysfs.resolve(anchor)
        key = None if real is None else sysfs.io.stat_key(sysfs.path(real))
        if key is None:
            # ...and when there is no key, nothing vouches: read again, recorded like any link.
            sysfs.vouched.remove(anchor, facts)
            if fresh:
                del sysfs._links[anchor]
                sysfs.resolve(anchor)
        return key

    def remember(self, sysfs: SysfsReader, anchor: str, key: IdentityKey | None, facts: ImmutableFacts) -> None:
        """Keep what this scan read of ``anchor``'s immutable ``facts`` (those :meth:`prime` vouched
        for). Facts the scan did not need stay unknown."""
        if key is None:
            return
        entry = self._entries.get(anchor)
        if entry is None or entry.key != key:
            real = sysfs._links.get(anchor)
            if not real:
                return
            entry = self._entries[anchor] = _Known(key, real)
        new_files = [n for n in facts.files if n not in entry.files and f"{anchor}/{n}" in sysfs._files]
        if new_files:
            values = [sysfs._files[f"{anchor}/{n}"] for n in new_files]
            entry.files = self._shape(entry.files + tuple(new_files))
            # Interned: the same class, vendor and device IDs recur on every function of a card.
            entry.file_values += tuple(v if v is None else sys.intern(v) for v in values)
        new_links = [x for x in facts.links if x not in entry.links and anchor + x in sysfs._links]
        if new_links:
            entry.links = self._shape(entry.links + tuple(new_links))
            entry.link_values += tuple(sysfs._links[anchor + x] for x in new_links)

    def _shape(self, names: tuple[str, ...]) -> tuple[str, ...]:
        return self._shapes.setdefault(names, names)

    def end_scan(self) -> None:
        """Forget objects this scan did not prime (gone from their listing)."""
        for anchor in [a for a in self._entries if a not in self._seen]:
            del self._entries[anchor]
        self._seen = set()


class _Known:
    """What :class:`IdentityCache` keeps of one object: its identity, real path, and the immutable
    files' contents and links' targets (names and values in two parallel tuples)."""

    __slots__ = ("file_values", "files", "key", "link_values", "links", "real")

    def __init__(self, key: IdentityKey, real: str) -> None:
        self.key, self.real = key, real
        self.files: tuple[str, ...] = ()
        self.file_values: tuple[str | None, ...] = ()
        self.links: tuple[str, ...] = ()
        self.link_values: tuple[str | None, ...] = ()


# -- ConnectX-8 "Data Direct" ------------------------------------------------------------------
#
# A ConnectX-8 can do its RDMA DMA through a separate PCI function, the "Data Direct" DMA engine
# (15b3:2100), which sits in the PCIe switch next to the GPU while the NIC's own function (the one
# with the netdev) hangs off another root port. The kernel's mlx5_ib binds the two when the DMA
# function's driver probes: it reads the VPD read-only keyword ``VU`` of the DMA function and
# compares it with the vuid the firmware reports for the RDMA device (drivers/infiniband/hw/mlx5/
# data_direct.c). That affiliation is only visible to user space through a verbs ioctl
# (mlx5dv_get_data_direct_sysfs_path), never in sysfs; rdma-core's rdma_topo and mstflint match the
# two functions by the VPD keyword ``V3`` that both carry. The NIC's GPU pairs with the DMA
# function's PCIe root, not its netdev's, so that is the root to publish.

MELLANOX_VENDOR = 0x15B3
DATA_DIRECT_DEVICE_IDS = frozenset({0x2100})
"""Device IDs of mlx5 Data Direct DMA functions: the kernel's ``mlx5_data_direct_pci_table`` and
rdma_topo's ``cx_dma`` (ConnectX-8)."""
PRE_DATA_DIRECT_DEVICE_IDS = frozenset(
    {0x1013, 0x1014, 0x1015, 0x1016, 0x1017, 0x1018, 0x1019, 0x101A, 0x101B, 0x101C, 0x101D, 0x101F, 0x1021}
    | {0xA2D2, 0xA2D6, 0xA2DC}
)
"""Mellanox functions that cannot have a Data Direct function (ConnectX-4 to ConnectX-7 and their
VFs, BlueField-1 to 3): a node full of them never pays for the search. Any other Mellanox function
(ConnectX-8 ``0x1023``, the shared VF ID ``0x101e``, IDs newer than this list) is looked up."""
VPD_MATCH_KEYWORDS = ("VU", "V3")
"""VPD read-only keywords that tie a NIC to its DMA function, in trust order: ``VU`` is what the
kernel matches, ``V3`` (the card's UUID) what rdma_topo and mstflint match."""
VPD_MAX = 32768
"""PCI VPD is at most 32 KiB (a 15-bit address)."""
_VPD_READ_ONLY, _VPD_END_ITEM = 0x90, 0x0F


def vpd_keywords(data: bytes) -> dict[str, str]:
    """The read-only (VPD-R) keywords of a PCI VPD image with printable ASCII values, or ``{}``.

    Resources: a large one (tag bit 7 set) has a 16-bit little-endian length after its tag, a small
    one its length in the tag's low 3 bits; the small item 0xF ends the image. A truncated or
    malformed image gives what was whole before the damage, never an exception.
    """
    out: dict[str, str] = {}
    data = data[:VPD_MAX]
    i = 0
    while i < len(data):
        tag = data[i]
        if tag & 0x80:
            if i + 3 > len(data):
                break
            start, length = i + 3, int.from_bytes(data[i + 1 : i + 3], "little")
        elif tag >> 3 == _VPD_END_ITEM:
            break
        else:
            start, length = i + 1, tag & 0x07
        end = start + length
        if end > len(data):
            break
        if tag == _VPD_READ_ONLY:
            j = start
            while j + 3 <= end:
                size = data[j + 2]
                if j + 3 + size > end:
                    break
                key, value = data[j : j + 2], data[j + 3 : j + 3 + size]
                j += 3 + size
                if not (key.isascii() and key.isalnum() and value.isascii()):
                    continue
                text = value.decode("ascii").strip("\x00 \t\r\n")
                if key != b"RV" and text.isprintable() and text:
                    out.setdefault(key.decode("ascii"), text)
        i = end
    return out


@dataclass(frozen=True, slots=True)
class DataDirectFunction:
    """One Data Direct DMA function: where it is and the VPD keywords that name its NIC."""

    pci_address: str
    pcie_root: str | None
    real_path: str
    driver: str | None
    keywords: tuple[tuple[str, str], ...]

    def keyword(self, name: str) -> str | None:
        """The value of VPD keyword ``name``, or None."""
        return next((v for k, v in self.keywords if k == name), None)


@dataclass(frozen=True, slots=True)
class DataDirectMatch:
    """What :func:`data_direct_for` found for one NIC function.

    ``function`` is set when the NIC's DMA goes through a Data Direct function that can carry it
    (matched, bound to a driver, under a known root). ``problem`` says why a NIC that looked like
    it has one got none; both None: the NIC has no Data Direct function (the common case)."""

    function: DataDirectFunction | None = None
    keyword: str | None = None
    problem: str | None = None


@dataclass
class DataDirectIndex:
    """The Data Direct functions of one scan, and the ones whose VPD could not be used."""

    functions: list[DataDirectFunction] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)  # BDF -> why its VPD gave no keyword

    @classmethod
    def scan(cls, sysfs: SysfsReader) -> DataDirectIndex:
        """Find every Data Direct function (by vendor and device ID) and read its VPD keywords.

        ``vendor`` and ``device`` are immutable identity files (the scan's identity cache vouches
        for them), so after the first scan this costs a lookup per function, and a VPD read only
        on machines that have Data Direct functions."""
        index = cls()
        for bdf in sysfs.listdir("bus/pci/devices"):
            base = f"bus/pci/devices/{bdf}"
            if sysfs.read_int(f"{base}/vendor", 16) != MELLANOX_VENDOR:
                continue
            if sysfs.read_int(f"{base}/device", 16) not in DATA_DIRECT_DEVICE_IDS:
                continue
            keywords, problem = _vpd_of(sysfs, base)
            if problem:
                index.unreadable[bdf] = problem
                continue
            real = sysfs.resolve(base) or ""
            index.functions.append(
                DataDirectFunction(
                    pci_address=bdf,
                    pcie_root=pcie_root_of(real),
                    real_path=real,
                    driver=sysfs.link_name(f"{base}/driver"),
                    keywords=tuple(sorted(keywords.items())),
                )
            )
        return index

    def match(self, sysfs: SysfsReader, bdf: str) -> DataDirectMatch:
        """The Data Direct function of NIC function ``bdf`` (see :class:`DataDirectMatch`)."""
        if not self.functions and not self.unreadable:
            return DataDirectMatch()
        base = f"bus/pci/devices/{bdf}"
        keywords, problem = _vpd_of(sysfs, base)
        if problem and sysfs.resolve(f"{base}/physfn"):
            keywords, problem = _vpd_of(sysfs, f"{base}/physfn")  # a VF: the card's VPD is its PF's
        if problem:
            return DataDirectMatch(problem=f"Data Direct functions are present but the NIC's {problem}")
        for name in VPD_MATCH_KEYWORDS:
            value = keywords.get(name)
            found = [f for f in self.functions if value is not None and f.keyword(name) == value]
            if len(found) > 1:
                listed = ", ".join(f.pci_address for f in found)
                return DataDirectMatch(problem=f"Data Direct functions {listed} all match its VPD {name}: ambiguous")
            if found:
                return self._usable(found[0], name)
        if self.unreadable:
            why = "; ".join(f"{b}: {p}" for b, p in sorted(self.unreadable.items()))
            return DataDirectMatch(problem=f"no Data Direct function matches its VPD, and some cannot be read ({why})")
        return DataDirectMatch()

    @staticmethod
    def _usable(function: DataDirectFunction, keyword: str) -> DataDirectMatch:
        """The match, or why the matched function cannot carry the NIC's DMA."""
        if not function.driver:
            # mlx5_ib affiliates the NIC with the DMA function only when the latter's driver probes.
            problem = f"its Data Direct function {function.pci_address} (VPD {keyword}) is bound to no driver"
            return DataDirectMatch(keyword=keyword, problem=problem)
        if function.pcie_root is None:
            problem = f"its Data Direct function {function.pci_address} is under no PCI host bridge"
            return DataDirectMatch(keyword=keyword, problem=problem)
        return DataDirectMatch(function=function, keyword=keyword)


def _vpd_of(sysfs: SysfsReader, base: str) -> tuple[dict[str, str], str | None]:
    """The VPD keywords of the function at ``base`` (a relative path), or why there are none."""
    answer = sysfs.read_bytes(f"{base}/vpd")
    if isinstance(answer, str):
        return {}, f"VPD cannot be read: {answer}"
    if not answer:
        return {}, "VPD is missing or empty"
    keywords = vpd_keywords(answer)
    if not any(k in keywords for k in VPD_MATCH_KEYWORDS):
        return {}, f"VPD has no {' or '.join(VPD_MATCH_KEYWORDS)} keyword"
    return keywords, None


def may_have_data_direct(vendor: int | None, device: int | None) -> bool:
    """Whether a function with these IDs could do its DMA through a Data Direct function."""
    return vendor == MELLANOX_VENDOR and device not in PRE_DATA_DIRECT_DEVICE_IDS | DATA_DIRECT_DEVICE_IDS


def data_direct_for(sysfs: SysfsReader, bdf: str) -> DataDirectMatch:
    """The Data Direct function carrying the DMA of NIC function ``bdf`` (see :class:`DataDirectMatch`).

    Read-only and cheap for every other function: non-Mellanox and pre-ConnectX-8 functions are
    answered from their (memoised) IDs; the scan's Data Direct functions are looked for once per
    :class:`SysfsReader`.
    """
    base = f"bus/pci/devices/{bdf}"
    if not may_have_data_direct(sysfs.read_int(f"{base}/vendor", 16), sysfs.read_int(f"{base}/device", 16)):
        return DataDirectMatch()
    if sysfs.data_direct is None:
        sysfs.data_direct = DataDirectIndex.scan(sysfs)
    return sysfs.data_direct.match(sysfs, bdf)


def is_data_direct_function(sysfs: SysfsReader, bdf: str) -> bool:
    """Whether ``bdf`` is itself a Data Direct DMA function (a DMA engine, not a NIC)."""
    base = f"bus/pci/devices/{bdf}"
    return (
        sysfs.read_int(f"{base}/vendor", 16) == MELLANOX_VENDOR
        and sysfs.read_int(f"{base}/device", 16) in DATA_DIRECT_DEVICE_IDS
    )
