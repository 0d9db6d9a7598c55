"""What a run is started with, in one object: the checkout's folders it reads and writes, the
control node's environment, and pyinfra's --dry / --diff. Built once, by the `dsv4deploy` command
(cli/main.py) or by an inventory while it loads (cli/inventories.py: host data `settings`), and
handed down as a value: no other module of the package reads sys.argv or the environment
(tests/test_architecture_inputs.py), and none finds the checkout from its own file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra.api import DeployError


def _checkout() -> Path | None:
    """The repository this package runs from (deploy/serve.py beside it), or None: a wheel
    installed into a venv, run in an operator's folder of inventory/, deploy/ and profiles/."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "deploy" / "serve.py").is_file() else None


CHECKOUT = _checkout()                              # profiles/, reports/, .cache/, deploy/
PROFILES_VAR = "DSV4_PROFILES_DIR"                  # another profiles folder (tests, forks)
HOST_DATA_KEY = "settings"                          # where an inventory puts it for the deploy steps


@dataclass(frozen=True)
class Settings:
    """The folders and inputs of one run (see the module docstring)."""

    checkout: Path          # deploy files, and the patch files profiles name (`file:` is relative to it);
                            # the repository, else (an installed wheel) the working directory
    profiles: Path          # named profiles: $DSV4_PROFILES_DIR, else <checkout>/profiles
    reports: Path           # gate reports (<host>/<release>-<profile>/) and tune reports: <checkout>/reports
    cache: Path             # kept between runs (hub metadata, rsync digests, tune state): <checkout>/.cache
    # the control node's environment as the command started (the HF token and endpoint are read
    # from it; child processes inherit it); never shown: it may hold a token
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    dry_run: bool = False   # pyinfra --dry (make plan): read the host, take no lock, change nothing
    show_diffs: bool = False   # pyinfra --diff or --dry: print the unit files' diffs

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], checkout: Path | None = None, *,
                         dry_run: bool = False, show_diffs: bool = False) -> "Settings":
        checkout = checkout or CHECKOUT or Path.cwd()
        profiles = environ.get(PROFILES_VAR)
        return cls(checkout=checkout, profiles=Path(profiles) if profiles else checkout / "profiles",
                   reports=checkout / "reports", cache=checkout / ".cache", environ=dict(environ),
                   dry_run=dry_run, show_diffs=show_diffs or dry_run)

    @property
    def hf_endpoint(self) -> str | None:
        """The hub the control node names (HF_ENDPOINT), None for huggingface.co."""
        return self.environ.get("HF_ENDPOINT") or None

    def shown(self, path: Path) -> str:
        """PATH as a message shows it: relative to the checkout when inside it."""
        return str(path.relative_to(self.checkout)) if path.is_relative_to(self.checkout) else str(path)


def settings_of(host_data) -> Settings:
    """The Settings an inventory put in the host data (cli/inventories.py profile_data); a
    DeployError naming the key when the inventory is not one of this project's."""
    settings = host_data.get(HOST_DATA_KEY)
    if not isinstance(settings, Settings):
        raise DeployError(f"host data `{HOST_DATA_KEY}` is missing: this project's inventories set it "
                          "(dsv4deploy.cli.inventories.profile_data); an inventory of your own must call that too")
    return settings
