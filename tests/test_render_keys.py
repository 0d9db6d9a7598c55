"""One key per power (render/keys.py): every rendered unit, read back as systemd reads it, holds
only the keys it needs: a server or replica the inference key and SGLang's admin key, the
gateway the inference key and its control-plane key; a render that would give a unit more
(or fewer) is refused."""

from __future__ import annotations

import pytest

from checkout import list_profiles, load_profile
from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.render import keys
from dsv4deploy.render.layout import Layout
from dsv4deploy.render.unit import render


def _held(name: str) -> dict[str, set[str]]:
    profile = load_profile(name)
    layout, rendered = Layout.of(profile.data), render(profile)
    admin = keys.has_admin_key(profile.data)
    held = {"server": keys.unit_keys(rendered.unit, layout, admin)}
    if rendered.gateway is not None:
        held["gateway"] = keys.unit_keys(rendered.gateway.unit, layout, admin)
    return held


@pytest.mark.parametrize("name", list_profiles())
def test_each_shipped_unit_holds_only_the_keys_of_its_power(name):
    keyed = load_profile(name).data["server"].get("api_key")
    held = _held(name)
    assert held["server"] == ({keys.INFERENCE, keys.ADMIN} if keyed else set())
    if "gateway" in held:
        assert held["gateway"] == ({keys.INFERENCE, keys.CONTROL} if keyed else set())
    assert all(keys.CONTROL not in h for unit, h in held.items() if unit != "gateway")
    assert all(keys.ADMIN not in h for unit, h in held.items() if unit != "server")


def test_the_three_keys_are_three_files_and_the_server_config_holds_two():
    layout = Layout.of(load_profile("nvfp4-ctx8k-dp2").data)
    files = {layout.api_key_file, layout.admin_key_file, layout.gateway_control_key_file, layout.sglang_config_secret}
    assert len(files) == 4 and all(f.startswith(layout.secrets_dir + "/") for f in files)
    assert keys.sources(layout, admin=True)[layout.sglang_config_secret] == {keys.INFERENCE, keys.ADMIN}


UNIT = "[Service]\nExecStart=/bin/true\n"


@pytest.mark.parametrize("line, held", [
    ("LoadCredential=sglang-config.yaml:/etc/dsv4deploy/secrets/sglang-sglang-config.yaml", {keys.INFERENCE, keys.ADMIN}),
    ("LoadCredential=x:/etc/dsv4deploy/secrets/sglang-gateway-control-key", {keys.CONTROL}),
    ("LoadCredentialEncrypted=x:/etc/dsv4deploy/secrets/sglang-admin-api-key", {keys.ADMIN}),
    ("EnvironmentFile=-/etc/dsv4deploy/secrets/sglang-api-key", {keys.INFERENCE}),
    ("LoadCredential=hf:/etc/dsv4deploy/secrets/hf-token", {"/etc/dsv4deploy/secrets/hf-token"}),
    ("SetCredential=k:sk-inline", {"SetCredential=k"}),
    ("ImportCredential=gateway-*", {"ImportCredential=gateway-*"}),
    ("LoadCredential=n:/etc/dsv4deploy/sglang/nccl.env", set()),
])
def test_every_way_a_unit_can_load_a_secret_is_seen(line, held):
    layout = Layout.of(load_profile("nvfp4-ctx8k").data)
    assert keys.unit_keys(UNIT + line + "\n", layout, admin=True) == held


def test_a_gateway_given_the_admin_key_is_refused_at_render(monkeypatch):
    """The mutation the check exists for: the gateway's inference-key credential pointed at
    SGLang's config file, which also holds the admin key (one path slip), renders no unit."""
    monkeypatch.setattr(Layout, "api_key_file", property(lambda self: self.sglang_config_secret))
    with pytest.raises(ProfileError, match="SGLang admin key, which it has no use for"):
        render(load_profile("nvfp4-ctx8k-dp2"))


def test_a_server_given_the_control_key_is_refused_at_render(monkeypatch):
    monkeypatch.setattr(Layout, "sglang_config_secret", property(lambda self: self.gateway_control_key_file))
    with pytest.raises(ProfileError, match="gateway control-plane key, which it has no use for"):
        render(load_profile("nvfp4-ctx8k"))
