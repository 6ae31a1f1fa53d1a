"""State that is reported saved is on disk: full disks, I/O errors, permissions, interrupted writes
and corrupt files at start.

ENOSPC comes from a real, small tmpfs; EACCES from a real non-root process; EIO (which a test
cannot provoke on a real disk) through the store's file-operations seam.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from driver.checkpoint.errors import CheckpointError, CheckpointWriteError
from driver.checkpoint.files import FileOps
from driver.checkpoint.state import PodNetState
from driver.checkpoint.store import CheckpointStore
from tests.checkpoint.test_store import _claim
from tests.plugins.tmpfs import TmpfsFactory, fill

ROOT = Path(__file__).resolve().parents[2]


def _add(store: CheckpointStore, *uids: str) -> None:
    def add(s) -> None:
        for uid in uids:
            s.claims[uid] = _claim(uid)

    store.update(add)


def test_a_short_write_on_a_nearly_full_disk_fails_and_keeps_the_previous_file(
    tmpfs_factory: TmpfsFactory, tmp_path: Path
) -> None:
    """Room for one page: the new file (several pages) is written short. The update must fail,
    naming the file and ENOSPC, and the previous file must stay whole (it was renamed over)."""
    state = tmpfs_factory.mount("state", "256k")
    store = CheckpointStore(state, tmp_path / "run")
    _add(store, *(f"u{i}" for i in range(4)))
    before = (state / "checkpoint.json").read_bytes()
    filler = fill(state, leave=4096)

    with pytest.raises(CheckpointWriteError) as caught:
        _add(store, *(f"big{i}" for i in range(20)))  # ~20 KB: needs more than the free page
    assert caught.value.errno == errno.ENOSPC
    assert str(state / "checkpoint.json") in str(caught.value) and "ENOSPC" in str(caught.value)
    assert (state / "checkpoint.json").read_bytes() == before  # untouched, still valid JSON
    assert not (state / "checkpoint.tmp").exists()  # the partial temporary file is gone
    assert store.read(lambda s: sorted(s.claims)) == [f"u{i}" for i in range(4)]  # memory = disk
    assert store.write_error is not None and store.write_error.errno == errno.ENOSPC
    filler.unlink()
    filler = fill(state)  # no free page at all: even the unchanged state cannot be rewritten
    assert not store.retry_write() and store.write_error is not None

    filler.unlink()
    assert store.retry_write() and store.write_error is None
    _add(store, "after")
    assert sorted(CheckpointStore(state, tmp_path / "run").read(lambda s: list(s.claims))) == sorted(
        [*(f"u{i}" for i in range(4)), "after"]
    )


def test_a_full_disk_fails_pods_json_too(tmpfs_factory: TmpfsFactory, tmp_path: Path) -> None:
    run = tmpfs_factory.mount("run", "64k")
    store = CheckpointStore(tmp_path / "state", run)
    store.update(lambda s: s.pods.__setitem__("p1", PodNetState("p1", netns_path="/run/netns/a")))
    before = (run / "pods.json").read_bytes()
    fill(run)
    with pytest.raises(CheckpointWriteError, match="pods.json.*ENOSPC"):
        store.update(lambda s: s.pods.__setitem__("p2", PodNetState("p2", netns_path="/run/netns/" + "b" * 8000)))
    assert (run / "pods.json").read_bytes() == before
    assert store.read(lambda s: list(s.pods)) == ["p1"]


class FaultyOps(FileOps):
    """File operations that fail with ``errno`` at the ``nth`` call of ``op``."""

    def __init__(self, op: str, err: int, nth: int = 1) -> None:
        calls = {"n": 0}
        real = getattr(os, op)

        def failing(*args):
            calls["n"] += 1
            if calls["n"] == nth:
                raise OSError(err, os.strerror(err))
            return real(*args)

        super().__init__(**{op: failing})


@pytest.mark.parametrize(
    ("op", "nth"),
    [("write", 1), ("fsync", 1), ("replace", 1), ("open", 1)],
)
def test_eio_at_each_step_of_a_write_fails_the_update_and_keeps_the_previous_file(
    tmp_path: Path, op: str, nth: int
) -> None:
    store = CheckpointStore(tmp_path)
    _add(store, "u1")
    before = (tmp_path / "checkpoint.json").read_bytes()
    faulty = CheckpointStore(tmp_path, ops=FaultyOps(op, errno.EIO, nth))
    with pytest.raises(CheckpointWriteError, match=r"checkpoint.json: Input/output error \(EIO\)"):
        _add(faulty, "u2")
    assert (tmp_path / "checkpoint.json").read_bytes() == before
    assert not (tmp_path / "checkpoint.tmp").exists()
    assert faulty.read(lambda s: sorted(s.claims)) == ["u1"]
    assert faulty.write_error is not None and faulty.write_error.errno == errno.EIO


def test_eio_on_the_directory_fsync_is_reported(tmp_path: Path) -> None:
    """The rename happened but its durability is unknown: the caller must not be told it is saved."""
    store = CheckpointStore(tmp_path, ops=FaultyOps("fsync", errno.EIO, nth=2))  # 1: file, 2: directory
    with pytest.raises(CheckpointWriteError, match="EIO") as failed:
        _add(store, "u1")
    assert store.write_error is not None and failed.value.replaced
    # Memory follows the file (which holds u1), so a retry finds the work done and a restart agrees.
    assert store.read(lambda s: sorted(s.claims)) == ["u1"]
    assert CheckpointStore(tmp_path).read(lambda s: sorted(s.claims)) == ["u1"]
    assert store.retry_write() and store.write_error is None


def test_the_failing_write_is_logged_once_with_path_and_errno(tmp_path: Path, caplog) -> None:
    store = CheckpointStore(tmp_path, ops=FaultyOps("write", errno.EIO, nth=1))
    with caplog.at_level(logging.ERROR, logger="driver.checkpoint"), pytest.raises(CheckpointWriteError):
        _add(store, "u1")
    (record,) = [r for r in caplog.records if r.name == "driver.checkpoint.store"]
    assert "checkpoint.json" in record.kv["path"] and "EIO" in record.kv["error"]


EACCES_WRITER = """
import json, sys
from driver.checkpoint.errors import CheckpointWriteError
from driver.checkpoint.store import CheckpointStore
from tests.checkpoint.test_store import _claim
store = CheckpointStore(sys.argv[1], sys.argv[2])
try:
    store.update(lambda s: s.claims.__setitem__("u2", _claim("u2")))
except CheckpointWriteError as exc:
    print(json.dumps({"error": str(exc), "errno": exc.errno, "claims": store.read(lambda s: sorted(s.claims))}))
else:
    print(json.dumps({"error": None}))
"""


def test_eacces_for_a_driver_without_write_permission(tmp_path: Path) -> None:
    """A real permission failure: the state directory belongs to nobody (mode 0755) and the writer
    is root without CAP_DAC_OVERRIDE (dropped from its bounding set with setpriv), so the kernel
    refuses it like any other user; root with the capability would ignore the mode bits."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop capabilities")
    state, run = tmp_path / "state", tmp_path / "run"
    store = CheckpointStore(state, run)
    _add(store, "u1")
    before = (state / "checkpoint.json").read_bytes()
    for path in (state, run):
        os.chown(path, 65534, 65534)
        path.chmod(0o755)
    drop = "-dac_override,-dac_read_search"
    out = subprocess.run(
        ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", "--", sys.executable, "-c", EACCES_WRITER]
        + [str(state), str(run)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["errno"] == errno.EACCES and "Permission denied (EACCES)" in result["error"]
    assert str(state / "checkpoint.json") in result["error"]
    assert result["claims"] == ["u1"]
    assert (state / "checkpoint.json").read_bytes() == before


def test_a_leftover_temporary_file_is_removed_at_start(tmp_path: Path, caplog) -> None:
    _add(CheckpointStore(tmp_path), "u1")
    (tmp_path / "checkpoint.tmp").write_bytes(b'{"claims":{"u1":{"ui')  # a write killed half-way
    (tmp_path / "pods.tmp").write_bytes(b"")
    with caplog.at_level(logging.INFO, logger="driver.checkpoint"):
        store = CheckpointStore(tmp_path)
    assert not (tmp_path / "checkpoint.tmp").exists() and not (tmp_path / "pods.tmp").exists()
    assert store.read(lambda s: list(s.claims)) == ["u1"]
    assert sum("interrupted state write" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize(
    "content",
    [b'{"claims":{"u1":{"uid":"u1","namesp', b"", b"\xff\xfe not utf-8", b"[1, 2]", b'{"claims": []}', b"null"],
    ids=["truncated", "empty", "binary", "array", "wrong-shape", "null"],
)
@pytest.mark.parametrize("name", ["checkpoint.json", "pods.json"])
def test_a_corrupt_state_file_is_moved_aside_and_the_store_starts_empty(
    tmp_path: Path, caplog, name: str, content: bytes
) -> None:
    (tmp_path / name).write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="driver.checkpoint"):
        store = CheckpointStore(tmp_path)
    (quarantined,) = store.quarantined
    assert quarantined.path == tmp_path / name
    assert quarantined.moved_to.name.startswith(f"{name}.corrupt-") and quarantined.moved_to.read_bytes() == content
    assert not (tmp_path / name).exists()
    assert store.read(lambda s: (s.claims, s.pods)) == ({}, {})
    (record,) = [r for r in caplog.records if "corrupt" in r.getMessage()]
    assert record.kv["moved_to"] == str(quarantined.moved_to)
    _add(store, "u1")  # and it works from there
    assert CheckpointStore(tmp_path).read(lambda s: list(s.claims)) == ["u1"]


def test_an_unreadable_state_file_is_refused_not_moved(tmp_path: Path) -> None:
    """EISDIR (or EIO) reading the file: not proof of damage; never move or guess."""
    (tmp_path / "checkpoint.json").mkdir()
    with pytest.raises(CheckpointError, match="cannot read"):
        CheckpointStore(tmp_path)
    assert (tmp_path / "checkpoint.json").is_dir()


STRANGE_READER = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a runaway read dies here, not the machine
from driver.checkpoint.store import CheckpointStore
store = CheckpointStore(sys.argv[1])
print(json.dumps({"quarantined": [[q.path.name, q.moved_to.name, q.reason] for q in store.quarantined]}))
"""


def _open_store_in_child(state: Path) -> dict:
    """A store opened on ``state`` in a child process (bounded memory and time: a read that never
    ends, or a FIFO that blocks the open, fails the test instead of hanging it)."""
    out = subprocess.run(
        [sys.executable, "-c", STRANGE_READER, str(state)], cwd=ROOT, capture_output=True, text=True, timeout=20
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", ["checkpoint.json", "pods.json"])
@pytest.mark.parametrize("kind", ["fifo", "symlink-to-dev-zero", "symlink-to-a-file", "oversized"])
def test_a_state_file_that_is_not_a_regular_file_is_moved_aside_unread(tmp_path: Path, name: str, kind: str) -> None:
    """A FIFO (whose open would block holding the lock), a symlink (to /dev/zero: an endless read; to
    another file: read through it), a file larger than any state: never read; moved aside as the link
    or node it is, and the store starts empty."""
    path = tmp_path / name
    target = tmp_path / "elsewhere.json"
    target.write_text('{"version": 2, "claims": {}}')
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "symlink-to-a-file":
        path.symlink_to(target)
    else:
        with open(path, "wb") as f:
            f.truncate(200 << 20)  # sparse: no disk used
    result = _open_store_in_child(tmp_path)
    [(quarantined, moved_to, reason)] = result["quarantined"]
    assert quarantined == name and moved_to.startswith(f"{name}.corrupt-")
    assert "symbolic link" in reason or "not a regular file" in reason or "bytes" in reason, reason
    assert not os.path.lexists(path)
    assert target.read_text() == '{"version": 2, "claims": {}}'
    store = CheckpointStore(tmp_path)
    _add(store, "u1")
    assert (tmp_path / "checkpoint.json").is_file() and not (tmp_path / "checkpoint.json").is_symlink()


def test_a_link_planted_as_the_temporary_file_is_never_written_through(tmp_path: Path) -> None:
    """``checkpoint.tmp`` made a symlink to another file after the store started: the next write
    removes the link and creates its own file; the link's target is untouched and checkpoint.json
    is a regular file holding the state."""
    store = CheckpointStore(tmp_path)
    _add(store, "u1")
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "checkpoint.tmp").symlink_to(victim)
    _add(store, "u2")
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "checkpoint.json").is_symlink()
    assert sorted(json.loads((tmp_path / "checkpoint.json").read_bytes())["claims"]) == ["u1", "u2"]


def test_a_read_only_state_disk_fails_each_write_clearly_and_counts_it(
    tmpfs_factory: TmpfsFactory, tmp_path: Path
) -> None:
    """The state directory's filesystem remounted read-only under a running store: each update fails
    with a CheckpointWriteError naming the file and EROFS (never a raw OSError), memory keeps what
    is on disk, the failures are counted per file, and writes work again once it is writable."""
    state = tmpfs_factory.mount("state")
    store = CheckpointStore(state, tmp_path / "run")
    _add(store, "u1")
    subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
    try:
        for _ in range(2):
            with pytest.raises(CheckpointWriteError) as err:
                _add(store, "u2")
            assert err.value.errno == errno.EROFS and str(state / "checkpoint.json") in str(err.value)
        assert store.write_error is not None and store.write_failures == {"checkpoint.json": 2}
        assert store.read(lambda s: sorted(s.claims)) == ["u1"]
        assert "Read-only file system" in (store.writable_problem() or "")
        assert not store.retry_write()
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
    assert store.retry_write() and store.write_error is None and store.writable_problem() is None
    _add(store, "u2")
    assert CheckpointStore(state, tmp_path / "run").read(lambda s: sorted(s.claims)) == ["u1", "u2"]
