"""The watch on the live server: after the gate, keep measuring what was deployed and decide like
an operator would. decide.py is the pure core (an interval's verdict, the action after a failure
limit), agent.py measures on the host (a sandboxed timer under its own account), act.py carries
out an action as root under the deploy lock, units.py renders their units and settings, and
status.py reads it all back for `dsv4deploy status`."""
