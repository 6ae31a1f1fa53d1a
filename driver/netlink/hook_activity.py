"""The driver's own link changes, announced by the hooks before they make them.

An NRI hook knows, before its first netlink request, which host links it will move, rename and
reconfigure. It opens :meth:`HookActivity.hook` for its whole duration and calls
:meth:`HookActivity.expect` with those links; the link events they cause in the host netns
(the NIC leaving, coming back, going up, its MTU) are then recognised by :meth:`is_own` and
dropped by the consumer: they describe a state the hook already has (in the pod, a device is
published from its prepare-time snapshot; back home, it is restored exactly as recorded), so
they must not cost a scan. Events are delivered after the change, sometimes after the hook
has returned, so an expectation outlives its hook by ``grace`` seconds.

The same object tells background work when a hook runs (:attr:`busy`, :meth:`wait_idle`,
:meth:`idle`), so publishing, updates and rescans can step aside for it instead of competing
for the interpreter lock while the runtime waits; they also let ``settle`` seconds pass after
a hook, while its answer goes back to the runtime. Waiters poll (every few ms) rather than
being woken by the hook: a wake-up at the hook's end would compete with sending its answer.

Thread-safe: hooks run in the NRI plugin's connection thread, events are read by the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator

GRACE = 2.0  # s an expectation outlives its hook (events queued in the socket arrive late)
SETTLE = 0.01  # s background work keeps waiting after a hook: its answer is still being sent
POLL = 0.005  # s between two looks of a waiting background task


class HookActivity:
    """Links hooks are changing (and just changed), and whether a hook is running."""

    def __init__(
        self, grace: float = GRACE, clock: Callable[[], float] = time.monotonic, settle: float = SETTLE
    ) -> None:
        self.grace = grace
        self.settle = settle
        self.clock = clock
        self._ended = float("-inf")  # when the last hook ended
        self._lock = threading.Lock()
        self._busy = 0
        self._names: dict[str, float] = {}  # name -> expiry (inf while its hook runs)
        self._indexes: dict[int, float] = {}
        self._open: list[tuple[set[str], set[int]]] = []  # expectations of running hooks
        self.own_events = 0  # events recognised as ours (tests, metrics)

    # -- the hooks' side ----------------------------------------------------------------------
    @contextlib.contextmanager
    def hook(self) -> Iterator[None]:
        """Mark a hook as running; expectations made inside expire ``grace`` s after it ends."""
        mine: tuple[set[str], set[int]] = (set(), set())
        with self._lock:
            self._busy += 1
            self._open.append(mine)
        try:
            yield
        finally:
            with self._lock:
                self._open.remove(mine)
                expiry = self.clock() + self.grace
                for name in mine[0]:
                    self._names[name] = expiry
                for index in mine[1]:
                    self._indexes[index] = expiry
                self._busy -= 1
                self._ended = self.clock()
            # Nobody is woken here: waiters poll. A wake-up now would compete with sending the
            # hook's answer; their next look comes after ``settle`` anyway.

    def expect(self, names: Iterable[str] = (), indexes: Iterable[int | None] = ()) -> None:
        """Events of these host links (by name or ifindex) are ours until the enclosing hook ends + grace."""
        with self._lock:
            if not self._open:
                raise RuntimeError("HookActivity.expect outside a hook")
            mine = self._open[-1]
            for name in names:
                if name:
                    mine[0].add(name)
                    self._names[name] = float("inf")
            for index in indexes:
                if index:
                    mine[1].add(index)
                    self._indexes[index] = float("inf")

    # -- the event consumer's side --------------------------------------------------------------
    def is_own(self, index: int, ifname: str) -> bool:
        """Whether an event for (``index``, ``ifname``) was caused by a hook (and counts it)."""
        with self._lock:
            now = self.clock()
            own = self._indexes.get(index, 0.0) > now or self._names.get(ifname, 0.0) > now
            if own:
                self.own_events += 1
            if len(self._names) + len(self._indexes) > 64:
                self._expire(now)
            return own

    def _expire(self, now: float) -> None:
        for table in (self._names, self._indexes):
            for key in [k for k, until in table.items() if until <= now]:
                del table[key]  # type: ignore[arg-type]

    # -- background work's side -----------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Whether a hook is running right now."""
        return self._busy > 0

    def _wait_for(self) -> float:
        """0 when background work may run now, else how long to wait before looking again."""
        with self._lock:
            if self._busy:
                return POLL
            return max(0.0, self._ended + self.settle - self.clock())

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block (a worker thread) until no hook runs and the last one settled; False on ``timeout``."""
        deadline = None if timeout is None else self.clock() + timeout
        while pause := self._wait_for():
            if deadline is not None and self.clock() + pause > deadline:
                return False
            time.sleep(pause)
        return True

    async def idle(self) -> None:
        """Wait (in an event loop) until no hook runs and the last one settled."""
        while pause := self._wait_for():
            await asyncio.sleep(pause)
