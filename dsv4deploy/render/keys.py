"""One key per power: which of the host's three keys each rendered unit holds, read back from
the unit as systemd reads it.

- the inference key: the API (generation, models); clients, the gate and bench_serving use it;
- SGLang's admin key: SGLang's management endpoints (loading other weights, freeing GPU memory,
  profiling, aborting requests, LoRA); with it set they refuse the inference key (0.5.23's
  `--admin-api-key`); nothing of the deploy calls them;
- the gateway's control-plane key: smg's `/workers` (add or remove a replica, or any URL).

Each lives in its own 0600 file under the root-only secrets folder (render/layout.py) and
reaches a unit only as a credential file. A server or replica holds the inference and admin
keys (one SGLang --config credential), the gateway the inference key (it checks clients' and
sends it to the replicas) and its control-plane key. `check` refuses a render where a unit
holds any other: a key that reaches one unit more than needed is refused, not shipped.
"""

from __future__ import annotations

from dsv4deploy.render import unitcheck
from dsv4deploy.render.layout import Layout
from dsv4deploy.sglang.versions import facts

INFERENCE = "inference key"
ADMIN = "SGLang admin key"
CONTROL = "gateway control-plane key"
SERVER_HOLDS = frozenset({INFERENCE, ADMIN})
GATEWAY_HOLDS = frozenset({INFERENCE, CONTROL})
# directives that hand a unit a file's content (a credential) or its lines (environment)
_LOADS = ("LoadCredential", "LoadCredentialEncrypted")
_INLINE = ("SetCredential", "SetCredentialEncrypted", "ImportCredential")


def has_admin_key(data: dict) -> bool:
    """Whether the server gets SGLang's admin key: it has an API key and the pinned SGLang an
    `--admin-api-key` (every release with flag data has)."""
    version = facts(data["sglang"]["version"])
    return bool(data["server"].get("api_key")) and version is not None and version.accepts("--admin-api-key")


def sources(layout: Layout, admin: bool) -> dict[str, frozenset[str]]:
    """Each secret file on the host -> the keys it holds. ADMIN: the pinned SGLang has an admin
    key (then SGLang's --config file holds it beside the inference key)."""
    return {layout.api_key_file: frozenset({INFERENCE}),
            layout.sglang_config_secret: frozenset({INFERENCE, ADMIN} if admin else {INFERENCE}),
            layout.admin_key_file: frozenset({ADMIN}),
            layout.gateway_control_key_file: frozenset({CONTROL})}


def unit_keys(unit: str, layout: Layout, admin: bool) -> set[str]:
    """The keys UNIT's [Service] hands its process: each credential or environment file it loads
    that is one of the host's secret files (sources), any other file in the secrets folder under
    its own name, and an inline or imported credential under its directive's."""
    held = sources(layout, admin)
    found: set[str] = set()
    for d in unitcheck.unit_directives(unit):
        if d.section != "Service":
            continue
        if d.key in _LOADS:
            path = d.value.partition(":")[2]
        elif d.key == "EnvironmentFile":
            path = d.value.removeprefix("-")
        elif d.key in _INLINE:
            found.add(f"{d.key}={d.value.partition(':')[0]}")
            continue
        else:
            continue
        if path in held:
            found |= held[path]
        elif path.startswith(layout.secrets_dir + "/"):
            found.add(path)
    return found


def check(unit: str, layout: Layout, admin: bool, want: frozenset[str] | set[str]) -> list[tuple[tuple, str]]:
    """[(profile key, message)] when UNIT holds other keys than WANT (more or fewer)."""
    try:
        got = unit_keys(unit, layout, admin)
    except unitcheck.SyntaxProblem as exc:
        return [(("server", "api_key"), f"its credentials do not read back: {exc}")]
    if admin is False:
        want = set(want) - {ADMIN}
    extra, missing = sorted(got - set(want)), sorted(set(want) - got)
    found = []
    if extra:
        found.append((("server", "api_key"), f"the unit would hold {', '.join(extra)}, which it has no use for"))
    if missing:
        found.append((("server", "api_key"), f"the unit lacks {', '.join(missing)}"))
    return found
