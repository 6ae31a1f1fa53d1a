"""``profile: <name>`` with the webhook profile provider: over the kubelet's real gRPC (prepare and
unprepare), a real checkpoint, a fake apiserver and dranet's webhook API served on 127.0.0.1."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.api.v1alpha1.network_config import InterfaceConfig, NetworkConfig, RouteConfig
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.prepare import Preparer
from driver.claims.profile import ProfileResolver, check_at_start, profile_resolver
from driver.config import DriverConfig
from driver.dra.health import DeviceHealthFeed
from driver.dra.plugin import KubeletPlugin
from driver.kube.client import KubeClient
from driver.metrics import Metrics
from driver.profiles.provider_client import ProviderClient
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from harness.kubelet_client import KubeletClient
from tests.claims.conftest import NODE, inventory
from tests.support.profile_webhook import ProfileWebhook

IPAM = {
    "interface": {"addresses": ["10.9.0.5/24"], "mtu": 1450},
    "routes": [{"destination": "10.90.0.0/16", "gateway": "10.9.0.1"}],
}


@pytest.fixture
def hook() -> Iterator[ProfileWebhook]:
    server = ProfileWebhook(profiles={"acme.com/ipam": IPAM}).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def kubelet_plugin(hook: ProfileWebhook) -> AsyncIterator[tuple[KubeletPlugin, FakeAPIServer]]:
    with tempfile.TemporaryDirectory(prefix="dranet-pp-") as d, FakeAPIServer() as api:
        tmp = Path(d)
        config = DriverConfig(
            node_name=NODE,
            kubelet_root=str(tmp / "kubelet"),
            cdi_dir=str(tmp / "cdi"),
            state_dir=str(tmp / "state"),
            profile_provider="webhook",
            webhook_url=hook.url,
        )
        resolver = profile_resolver(config)
        assert isinstance(resolver, ProfileResolver) and check_at_start(resolver) == ""
        resolver.client.timeout = 1.0  # the slow-provider test waits this long, not PROFILE_WEBHOOK_TIMEOUT
        kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp / "kubeconfig")))
        preparer = Preparer(
            kube, CheckpointStore(config.state_dir), ClaimBuilder(inventory, "dra.net", NODE, profiles=resolver)
        )
        sockets = (config.dra_socket, config.registration_socket)
        plugin = KubeletPlugin(preparer, config.driver_name, *sockets, health=DeviceHealthFeed(), metrics=Metrics())
        await plugin.start()
        try:
            yield plugin, api
        finally:
            await plugin.stop(grace=0.1)


def store_of(plugin: KubeletPlugin) -> CheckpointStore:
    """The checkpoint of the Preparer the plugin serves."""
    assert isinstance(plugin.driver, Preparer)
    return plugin.driver.store


def _claim(api: FakeAPIServer, parameters: dict[str, Any], uid: str = "uid-1") -> None:
    configs = [{"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": parameters}}]
    api.add_claim(make_claim("ns", f"c-{uid}", uid, [result("pci-0000-8a-00-0", NODE)], configs=configs, pods=["p"]))


async def test_prepare_merges_the_profile_under_the_claim_and_unprepare_releases_it(
    kubelet_plugin: tuple[KubeletPlugin, FakeAPIServer], hook: ProfileWebhook
) -> None:
    plugin, api = kubelet_plugin
    _claim(api, {"profile": "acme.com/ipam", "interface": {"name": "net1", "mtu": 9000}})
    async with KubeletClient(plugin.registration_socket) as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([("ns", "c-uid-1", "uid-1")])
        assert resp.claims["uid-1"].error == ""
        [asked] = hook.calls("/GetProfileConfig")
        assert asked["device"] == {"name": "ib0", "pci_address": "0000:8a:00.0"}
        assert asked["claim"]["metadata"]["uid"] == "uid-1" and asked["claim"]["status"]["reservedFor"]
        assert asked["config"]["profile"] == "acme.com/ipam" and asked["config"]["interface"]["mtu"] == 9000
        assert "apiVersion" not in asked["config"], "dranet's NetworkConfig JSON"
        [device] = store_of(plugin).read(lambda s: s.claims["uid-1"].devices)
        assert device.config.interface == InterfaceConfig(name="net1", mtu=9000, addresses=("10.9.0.5/24",))
        assert device.config.routes == (RouteConfig("10.90.0.0/16", "10.9.0.1"),)
        assert device.config.profile == "acme.com/ipam"
        retry = await kubelet.prepare([("ns", "c-uid-1", "uid-1")])
        assert retry.claims["uid-1"].error == "" and len(hook.calls("/GetProfileConfig")) == 1, "from the checkpoint"
        un = await kubelet.unprepare([("ns", "c-uid-1", "uid-1")])
        assert un.claims["uid-1"].error == ""
    [released] = hook.calls("/ReleaseProfileConfig")
    assert released["claim_uid"] == "uid-1" and released["device"]["name"] == "ib0"
    assert released["config"]["profile"] == "acme.com/ipam"
    assert released["config"]["interface"]["addresses"] == ["10.9.0.5/24"]


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (lambda h: None, "profile 'nope': http://127.0.0.1:"),
        (lambda h: h.status.update({"/GetProfileConfig": (409, "10.9.0.5 in use")}), "HTTP 409: 10.9.0.5 in use"),
        (lambda h: setattr(h, "delay", 3.0), "no answer within 1s"),
        (lambda h: h.stop(), "Connection refused"),
    ],
    ids=["unknown-profile", "refused", "slow", "down"],
)
async def test_provider_failures_are_the_claims_error_never_a_traceback(
    kubelet_plugin: tuple[KubeletPlugin, FakeAPIServer], hook: ProfileWebhook, setup: Any, needle: str
) -> None:
    plugin, api = kubelet_plugin
    profile = "nope" if "unknown" in needle or "nope" in needle else "acme.com/ipam"
    _claim(api, {"profile": profile})
    setup(hook)
    async with KubeletClient(plugin.registration_socket) as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([("ns", "c-uid-1", "uid-1")])
    error = resp.claims["uid-1"].error
    assert error.startswith("ResourceClaim ns/c-uid-1: config for request 'nic': profile ")
    assert needle in error and "Traceback" not in error, error
    assert store_of(plugin).read(lambda s: s.claims) == {}, "nothing prepared: the kubelet retries"


async def test_an_invalid_profile_answer_names_the_field_and_the_profile_and_is_released(
    kubelet_plugin: tuple[KubeletPlugin, FakeAPIServer], hook: ProfileWebhook
) -> None:
    plugin, api = kubelet_plugin
    hook.profiles["bad"] = {"interface": {"mtu": "9000", "colour": "red"}}
    hook.profiles["clash"] = {"interface": {"addresses": ["10.9.0.6/24"]}}
    _claim(api, {"profile": "bad"})
    _claim(api, {"profile": "clash", "interface": {"dhcp": True}}, uid="uid-2")
    async with KubeletClient(plugin.registration_socket) as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([("ns", "c-uid-1", "uid-1"), ("ns", "c-uid-2", "uid-2")])
    bad, clash = resp.claims["uid-1"].error, resp.claims["uid-2"].error
    source = f"profile 'bad' ({hook.url}/GetProfileConfig): answer"
    assert f"{source}.interface.mtu: must be an integer" in bad, bad
    assert f"{source}.interface.colour: unknown field" in bad, bad
    assert "profile 'clash'" in clash and "interface.dhcp: dhcp and addresses are mutually exclusive" in clash, clash
    released = sorted(c["config"]["profile"] for c in hook.calls("/ReleaseProfileConfig"))
    assert released == ["bad", "clash"], "a profile answered for a claim that then fails is released"


async def test_a_profile_without_a_provider_is_refused(tmp_path: Path) -> None:
    with FakeAPIServer() as api:
        kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        preparer = Preparer(kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(inventory, "dra.net", NODE))
        _claim(api, {"profile": "acme.com/ipam"})
        from driver.dra.protocol import ClaimRef

        out = await preparer.prepare([ClaimRef("ns", "c-uid-1", "uid-1")])
    assert (
        "profile 'acme.com/ipam': no profile provider (--profile-provider=webhook --webhook-url)" in out["uid-1"].error
    )


def test_a_provider_that_serves_no_profiles_stops_the_daemon(hook: ProfileWebhook) -> None:
    hook.capabilities = {"cloudProvider": True, "profileProvider": False}
    problem = check_at_start(ProfileResolver(ProviderClient(hook.url, timeout=1)))
    assert "is not a profile provider (profileProvider: false)" in problem
    hook.stop()
    assert check_at_start(ProfileResolver(ProviderClient(hook.url, timeout=1))) == "", "down at start: not fatal"


def test_the_merge_is_the_cloud_merge_user_wins() -> None:
    from driver.api.v1alpha1.merge import merge_under_cloud

    profile = NetworkConfig(interface=InterfaceConfig(mtu=1450, addresses=("10.9.0.5/24",)))
    claim = NetworkConfig(interface=InterfaceConfig(mtu=9000, addresses=("10.9.0.7/24",)), profile="p")
    merged = merge_under_cloud(profile, claim)
    assert merged.interface == InterfaceConfig(mtu=9000, addresses=("10.9.0.5/24", "10.9.0.7/24"))


@pytest.mark.parametrize(
    ("url", "needle"),
    [(None, "--webhook-url is required"), ("ftp://x", "the scheme must be http, https or unix")],
)
def test_webhook_provider_flags_that_cannot_work_stop_the_daemon(url: str | None, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        profile_resolver(DriverConfig(node_name=NODE, profile_provider="webhook", webhook_url=url))
    assert profile_resolver(DriverConfig(node_name=NODE, profile_provider="none", webhook_url=url)) is None
