"""`dsv4deploy tune`: find the best profile that passes, by measuring on the host.

One concern per module:

- knobs.py       the profile keys a tune may turn, typed by the profile schema; restart costs
- space.py       the search space: the profile's `tune:` block and `--set` on the command line
- candidates.py  base + overrides, pruned by the real validator and memory budget
- objective.py   SLOs, levels, measurements, feasibility, the Pareto front
- scheduler.py   successive halving within a wall-clock budget, over an injected measure()
- state.py       resumable state on the control node (.cache/tune/<profile>.json)
- tuned.py       profiles/<base>-tuned.yaml: extends the base, only the chosen values, validated
- report.py      reports/tune-<profile>-<time>/: JSON, Markdown, PNG
- backend.py     THE plug-in point for on-host measurement (open_backend)
- command.py     the command's steps, for cli.py
"""
