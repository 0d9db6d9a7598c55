"""No egress for model code (issue 37, item 5): the server, replica and gateway units exchange
packets with loopback and only the networks the profile names; a server bound beyond loopback
needs an API key and its clients' networks; on one host NCCL and gloo stay on loopback.
The twin shows the rule from inside the running unit: tests/test_faults_twin.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkout import load_profile
from dsv4deploy.profile import network
from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.profile.validate import validate
from dsv4deploy.render import unitcheck
from dsv4deploy.render.unit import render
from test_unit_sandbox import needs_analyze, exposure

EXPOSURE_MAX = 1.8     # the rating every unit kept before this change; IP rules only lower it


def ip_lines(unit: str) -> list[str]:
    return [line for line in unit.splitlines() if line.startswith("IPAddress")]


def problems(report, severity: str = "error") -> dict[str, str]:
    return {f"{p.path}@{p.line}": p.message for p in report.problems if p.severity == severity}


def test_every_shipped_unit_talks_to_loopback_only_by_default():
    single, dp2 = render(load_profile("nvfp4-ctx8k")), render(load_profile("nvfp4-ctx8k-dp2"))
    for unit in (single.unit, dp2.unit, dp2.gateway.unit):
        assert ip_lines(unit) == ["IPAddressDeny=any", "IPAddressAllow=localhost"]
        assert unitcheck.ip_access(unit) == (["localhost"], ["any"])


def test_named_networks_reach_only_the_unit_that_needs_them(profile_dir):
    """Clients go to the listener (the gateway), egress to the model servers; replicas, which
    listen on loopback, never get the client networks."""
    profile_dir.write("egress-set", """
        extends: nvfp4-ctx8k-dp2
        service: {allow_clients: [10.20.0.0/16, "2001:db8::/32"], allow_egress: [192.0.2.7]}
        replicas: {gateway: {host: 0.0.0.0}}
    """)
    rendered = render(load_profile("egress-set"))
    assert ip_lines(rendered.unit)[1] == "IPAddressAllow=localhost 192.0.2.7/32"
    assert ip_lines(rendered.gateway.unit)[1] == "IPAddressAllow=localhost 10.20.0.0/16 2001:db8::/32"
    profile_dir.write("egress-one", """
        extends: nvfp4-ctx8k
        server: {host: 0.0.0.0}
        service: {allow_clients: [10.20.0.0/16], allow_egress: [192.0.2.7]}
    """)
    report = validate(load_profile("egress-one"))
    assert report.ok, [str(p) for p in report.errors]
    assert ip_lines(render(load_profile("egress-one")).unit)[1] == "IPAddressAllow=localhost 10.20.0.0/16 192.0.2.7/32"


def test_a_server_bound_beyond_loopback_needs_a_key_and_its_clients(profile_dir):
    profile_dir.write("open", """
        extends: nvfp4-ctx8k
        server:
          host: 0.0.0.0
          api_key: false
    """)
    got = problems(validate(load_profile("open")))
    assert "beyond loopback: set server.api_key: true" in got["server.api_key@4"]
    assert "service.allow_clients" in got["server.host@3"] and "IPAddressDeny=any" in got["server.host@3"]


def test_the_gateway_obeys_the_same_rule(profile_dir):
    profile_dir.write("gw", """
        extends: nvfp4-ctx8k-dp2
        replicas:
          gateway: {host: 10.0.0.5}
    """)
    got = problems(validate(load_profile("gw")))
    assert "the gateway" in got["replicas.gateway.host@3"] and "service.allow_clients" in got["replicas.gateway.host@3"]


@pytest.mark.parametrize("value, why", [("10.0.0.1/8", "host bits set"), ("10.0.0.0/33", "33"),
                                        ("::1::2", "IP network"), ("1.2.3", "IP network")])
def test_a_network_that_does_not_parse_is_refused_at_its_line(profile_dir, value, why):
    profile_dir.write("bad", f"""
        extends: nvfp4-ctx8k
        service:
          allow_egress:
            - 192.0.2.0/24
            - "{value}"
    """)
    got = problems(validate(load_profile("bad")))
    assert list(got) == ["service.allow_egress[1]@5"] and why in got["service.allow_egress[1]@5"], got


def test_characters_outside_an_address_are_refused_by_the_boundary_rule(profile_dir, capsys):
    from dsv4deploy.cli.main import main

    profile_dir.write("inject", 'extends: nvfp4-ctx8k\nservice: {allow_egress: ["10.0.0.0/8 0.0.0.0/0"]}\n')
    assert main(["validate", "inject"]) == 2
    assert "inject.yaml:2: service.allow_egress[0]: " in capsys.readouterr().err


def test_every_address_is_a_warning_and_a_loopback_listener_with_clients_too(profile_dir):
    profile_dir.write("wide", "extends: nvfp4-ctx8k\nservice: {allow_egress: [0.0.0.0/0], allow_clients: [10.0.0.0/8]}\n")
    report = validate(load_profile("wide"))
    assert report.ok
    warned = problems(report, "warning")
    assert "whole network" in warned["service.allow_egress[0]@2"]
    assert "127.0.0.1 only" in warned["service.allow_clients@2"]


def test_one_host_keeps_nccl_and_gloo_on_loopback_unless_overridden(profile_dir):
    env = render(load_profile("nvfp4-ctx8k")).nccl_env.splitlines()
    assert "NCCL_SOCKET_IFNAME=lo" in env and "GLOO_SOCKET_IFNAME=lo" in env
    profile_dir.write("ifname", "extends: nvfp4-ctx8k\nnccl: {preset: ll-ring, overrides: {NCCL_SOCKET_IFNAME: eth0}}\n")
    assert "NCCL_SOCKET_IFNAME=eth0" in render(load_profile("ifname")).nccl_env.splitlines()
    profile_dir.write("gloo", "extends: nvfp4-ctx8k\nserver: {env: {GLOO_SOCKET_IFNAME: eth0}}\n")
    assert "silently win" in problems(validate(load_profile("gloo")))["server.env.GLOO_SOCKET_IFNAME@2"]


def test_a_multi_node_peer_is_allowed_and_its_sockets_are_not_pinned_to_loopback(profile_dir):
    profile_dir.write("two", """
        extends: nvfp4-ctx8k
        server:
          nnodes: 2
          extra_args: [--dist-init-addr, "10.1.2.3:5000"]
    """)
    data = load_profile("two").data
    assert network.server_allow(data) == ["localhost", "10.1.2.3/32"] and not network.single_host(data)
    rendered = render(load_profile("two"))
    assert "IPAddressAllow=localhost 10.1.2.3/32" in rendered.unit.splitlines()
    assert "SOCKET_IFNAME" not in rendered.nccl_env
    profile_dir.write("named", 'extends: nvfp4-ctx8k\nserver: {extra_args: ["--dist-init-addr=head:5000"]}\n')
    assert "as an IP address" in problems(validate(load_profile("named")))["server.extra_args@2"]


def test_hardening_off_renders_no_ip_rules():
    profile = load_profile("nvfp4-ctx8k")
    data = {**profile.data, "service": {**profile.data["service"], "hardening": "off"}}
    unit = render(type(profile)(name=profile.name, data=data, origins=profile.origins, files=profile.files)).unit
    assert ip_lines(unit) == [] and unitcheck.check_ip_access(unit, None) == []


@pytest.mark.parametrize("edit, says", [
    (lambda u: u.replace("IPAddressDeny=any\n", ""), "not ['any']"),
    (lambda u: u.replace("IPAddressAllow=localhost\n", "IPAddressAllow=localhost\nIPAddressAllow=0.0.0.0/0\n"),
     "0.0.0.0/0"),
    (lambda u: u.replace("IPAddressDeny=any\n", "IPAddressDeny=any\nIPAddressDeny=\n"), "not ['any']"),
    (lambda u: u.replace("IPAddressAllow=localhost\n", "IPAddressAllow=localhost\n[Install]\nIPAddressAllow=\n"
                         "[Service]\nIPAddressAllow=10.0.0.1/8\n"), "10.0.0.0/8"),
])
def test_the_read_back_sees_a_unit_that_lets_more_through(edit, says):
    unit = render(load_profile("nvfp4-ctx8k")).unit
    found = unitcheck.check_ip_access(edit(unit), ["localhost"])
    assert found and says in " ".join(msg for _, msg in found), found


def test_a_render_whose_ip_rules_do_not_read_back_is_refused(monkeypatch):
    monkeypatch.setattr(network, "server_allow", lambda data: ["localhost", "not-a-net"])
    with pytest.raises(ProfileError) as exc:
        render(load_profile("nvfp4-ctx8k"))
    assert "IPAddress" in str(exc.value) or "not-a-net" in str(exc.value)


@needs_analyze
def test_units_with_named_networks_still_rate_at_most_1_8(profile_dir, tmp_path: Path):
    profile_dir.write("egress-set", """
        extends: nvfp4-ctx8k-dp2
        service: {allow_clients: [10.20.0.0/16], allow_egress: [192.0.2.7]}
        replicas: {gateway: {host: 0.0.0.0}}
    """)
    rendered = render(load_profile("egress-set"))
    single = render(load_profile("nvfp4-ctx8k"))
    for name, text in (("a.service", rendered.unit), ("b.service", rendered.gateway.unit), ("c.service", single.unit)):
        (tmp_path / name).write_text(text)
        assert exposure(tmp_path / name) <= EXPOSURE_MAX, name
