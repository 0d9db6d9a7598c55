"""The release model: records kept on the host, why a run restarts the server, and what one run
works from (the validated profile, its rendered files, the inventory's stand-ins)."""
