"""The smg gateway in front of replicas: its pinned release, flags and worker list, and the launcher
that hands it the API key as a systemd credential."""
