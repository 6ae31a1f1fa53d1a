"""What the running kernel has, for the tests that depend on it: a skip names the kernel and the
feature it lacks (the stock-kernel tier, tests/kernels, lists them per kernel)."""

from __future__ import annotations

import os
import subprocess

import pytest

from driver.netlink import kernel_features


def release() -> str:
    """``uname -r``."""
    return os.uname().release


def skip_unless(available: bool, feature: str) -> None:
    """Skip the test when the running kernel lacks ``feature`` (a phrase: "VRF links")."""
    if not available:
        pytest.skip(f"kernel {release()} has no {feature}")


def skip_if(present: bool, feature: str, why: str) -> None:
    """Skip a test of the path taken *without* ``feature`` when the running kernel has it."""
    if present:
        pytest.skip(f"kernel {release()} has {feature}: {why}")


def has_link_kind(netns: str, kind: str, *args: str) -> bool:
    """Whether ``ip link add`` can make a ``kind`` link in ``netns`` (a throwaway namespace)."""
    made = subprocess.run(["ip", "-n", netns, "link", "add", "kprobe0", "type", kind, *args], capture_output=True)
    subprocess.run(["ip", "-n", netns, "link", "del", "kprobe0"], capture_output=True)
    return made.returncode == 0


def features() -> kernel_features.KernelFeatures:
    """The running kernel's features as the driver sees them at start."""
    return kernel_features.detect()
