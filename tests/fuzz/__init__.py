"""Property-based fuzzing of every decoder that reads untrusted bytes (hypothesis).

Property everywhere: a clear error or a valid result, never an unexpected exception, in bounded
time. The budget is fixed here so the whole suite stays under a minute in ``make test``:
:data:`FUZZ` runs :data:`EXAMPLES` examples per test, each with a :data:`DEADLINE` (hypothesis fails
an example that takes longer: "bounded time"), no example database (the suite is hermetic and
every run explores afresh; hypothesis prints the seed of a failure to reproduce it).
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, settings

EXAMPLES = 300
DEADLINE = timedelta(seconds=2)
"""Per example. Generous for a shared 2-core machine; a hang or a quadratic blow-up exceeds it."""

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=DEADLINE,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


class LoopThread:
    """An event loop in a thread, so synchronous hypothesis tests can drive async servers."""

    def __init__(self) -> None:
        import asyncio
        import threading

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float = 30.0):
        """Run ``coro`` on the loop and wait for its result."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop and join the thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
