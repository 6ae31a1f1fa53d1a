"""`dranet webhook` starts kopf with its own identity: no passwd lookup of the running uid.

The image runs the webhook as uid 65532, which has no passwd entry (OpenShift: any uid). kopf's
own identity lookup (getpass.getuser) raised KeyError there and the webhook pod crash-looped on
the real node (tests/e2e/node); `dranet webhook` now passes its own identity.
"""

from __future__ import annotations

import pwd

import kopf
import pytest

from driver import cli


def test_identity_needs_no_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_user(uid: int) -> None:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_user)
    seen: dict[str, object] = {}
    monkeypatch.setattr(kopf, "run", lambda **kw: seen.update(kw))
    assert cli.main(["webhook", "--port", "0"]) == 0
    assert isinstance(seen["identity"], str) and seen["identity"].startswith("dranet-webhook@")
    assert seen["standalone"] is True
