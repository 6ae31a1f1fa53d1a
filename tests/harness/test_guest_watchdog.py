"""The guest runner's watchdog, with a shell script standing in for QEMU: a boot that never starts
its command and a command that stops printing are killed and booted again, and a guest that
keeps failing is an error that carries its output and console, never a wait to the tier's end."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devcluster.builders.stock_kernel import StockKernel
from harness import guest

# What each boot of the fake does, by its number (1-based, counted in the run folder).
SCRIPT = """
folder={folder}
n=$(( $(cat $folder/boots 2>/dev/null || echo 0) + 1 )); echo $n > $folder/boots
case "$(sed -n ${{n}}p $folder/plan)" in
  panic) echo "Oops: int3 in sched_clock_cpu" > $folder/console.log; exit 0 ;;
  hang) exec sleep 60 ;;
  stall) echo 1.0 > $folder/boot_s; echo started > $folder/output.txt; exec sleep 60 ;;
  ok) echo 1.0 > $folder/boot_s; echo "119 passed" > $folder/output.txt; echo 0 > $folder/rc ;;
esac
"""


@pytest.fixture
def fake_qemu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    folder = tmp_path / "run"

    def command(kernel, run_folder, *args, **kwargs):  # type: ignore[no-untyped-def]
        return ["sh", "-c", SCRIPT.format(folder=run_folder)]

    monkeypatch.setattr(guest, "qemu_command", command)
    monkeypatch.setattr(guest, "warm_bytecode", lambda *a, **k: 0.0)
    monkeypatch.setattr(guest, "BOOT_DEADLINE_S", 1)
    monkeypatch.setattr(guest, "STALL_S", 1)
    monkeypatch.setattr(guest, "WATCH_S", 0.2)

    def run(plan: list[str], timeout: float = 60) -> guest.GuestRun:
        folder.mkdir(exist_ok=True)
        (folder / "plan").write_text("\n".join(plan) + "\n")
        kernel = StockKernel(package="linux-image-test", version="0", release="6.1.0-test", root=tmp_path)
        return guest.run("true", folder, kernel=kernel, timeout=timeout)

    return run, folder


def test_a_boot_that_hangs_before_its_command_is_booted_again(fake_qemu) -> None:  # type: ignore[no-untyped-def]
    run, folder = fake_qemu
    start = time.monotonic()
    result = run(["hang", "ok"])
    assert result.rc == 0 and "119 passed" in result.output
    assert (folder / "boots").read_text().strip() == "2"
    assert len(result.panics) == 1
    assert time.monotonic() - start < 30  # killed after BOOT_DEADLINE_S, not after its 60 s


def test_a_command_that_stops_printing_is_booted_again_once(fake_qemu) -> None:  # type: ignore[no-untyped-def]
    run, folder = fake_qemu
    result = run(["panic", "stall", "ok"])
    assert result.rc == 0
    assert (folder / "boots").read_text().strip() == "3"
    assert any("stood still" in p for p in result.panics)


def test_a_second_stall_is_an_error_with_the_guests_output(fake_qemu) -> None:  # type: ignore[no-untyped-def]
    run, folder = fake_qemu
    with pytest.raises(guest.GuestError, match="printed nothing for 1 s") as raised:
        run(["stall", "stall", "ok"])
    assert "started" in str(raised.value)  # the output's tail: where it stood
    assert (folder / "boots").read_text().strip() == "2"


def test_boots_that_keep_hanging_end_in_an_error_not_a_wait(fake_qemu) -> None:  # type: ignore[no-untyped-def]
    run, folder = fake_qemu
    start = time.monotonic()
    with pytest.raises(guest.GuestError, match="did not start its command"):
        run(["hang"] * 5)
    assert (folder / "boots").read_text().strip() == str(guest.BOOT_TRIES)
    assert time.monotonic() - start < 45
