"""Zero-downtime rolling update, measured on the CT200 twin (issue 13): a constant streaming load
on the gateway (C=32, random 256/256 on /generate) while a changed profile rolls out across the
replicas, then while `make rollback` rolls the set back the same way.

    make sim-up
    .venv/bin/python bench/rolling.py [--concurrency 32] [--no-rollback] [--contention] [--floor-s 300]

Two replicas (nvfp4-ctx8k-dp2, the shipped profile, with a shorter gate so that the run takes
minutes) run behind the real smg gateway; the changed profile differs in its chunked prefill
size, so every replica restarts. Two rows come first, with nothing changing: the set through the
gateway (the load's own baseline), and the same load on one replica alone, straight to its port,
for as long as a rolling update keeps one replica out (what users get while the other is
replaced, whatever the rollout does). The load runs from this machine to the twin's loopback
endpoint (127.0.0.1:30000) with the API key read from the twin. `--floor-s S` adds, after the
update, S seconds of that load on one replica alone, seen through windows as long as the update:
how often the 2 s bound breaks with no rollout running at all. Prints figures; asserts
nothing; the last line is `rolling: failed_requests=N max_gap_s=X duration_s=Y` for the update.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dsv4deploy.render.layout import Layout  # noqa: E402
from dsv4deploy.profile.load import load_profile  # noqa: E402
from dsv4deploy.profile.replicas import plan as replica_plan  # noqa: E402
from ct200twin.faultlab import FAST_START, FAULTS  # noqa: E402
from ct200twin.faultlab.tool import Run, deploy, deploy_watching, run  # noqa: E402
from ct200twin.faultlab.variants import QUICK_GATE, write_profiles  # noqa: E402
from ct200twin.host.machines import SimHost, up  # noqa: E402
from ct200twin.host.load import StreamingLoad, longest_gap, windows_over  # noqa: E402

BASE, CHANGED = "rolling-a", "rolling-b"
BOUND_S = 2.0        # issue 13's target: no gap between completions over 2 s
VARIANTS = {BASE: f"extends: nvfp4-ctx8k-dp2\n{QUICK_GATE}",
            CHANGED: f"extends: nvfp4-ctx8k-dp2\nserver:\n  chunked_prefill_size: 4096\n{QUICK_GATE}"}
ALONE_S = 33.0       # one replica's switch in a rolling update here: drained, restarted, gated, back
STAGGER_S = 15.0     # about one request's duration at C=32: the clients' starts spread over it


def during(lines: list[tuple[float, str]], at: float) -> str:
    """The deploy's last own line ("[host] ...") printed before AT: which step a gap fell in."""
    said = [line for t, line in lines if t <= at and (line.startswith("[") or line.startswith("--> Starting"))]
    return said[-1].strip()[:120] if said else "(before the deploy's first line)"


def measured(label: str, action, url: str, key: str, concurrency: int, settle_s: float) -> tuple[dict, str]:
    """Run ACTION (a deploy, given a callback for each output line) under the load, once the load
    is steady; the figures between its start and end, and the step each longest gap fell in."""
    load = StreamingLoad(url, concurrency=concurrency, api_key=key, stagger_s=STAGGER_S).start()
    time.sleep(STAGGER_S + settle_s)
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()
    out = action(lambda line: lines.append((time.monotonic(), line)))
    t1 = time.monotonic()
    time.sleep(settle_s)
    res = load.stop()
    (gap, gap_at), (tgap, tgap_at) = longest_gap(res.completions, t0, t1), longest_gap(res.tokens_at, t0, t1)
    fig = {"what": label, "rc": out.rc, "duration_s": t1 - t0, "sent": res.sent, "completed": res.completed,
           "failed": res.failed, "max_gap_s": gap, "max_token_gap_s": tgap, "errors": sorted(set(res.errors))[:5],
           "where": [f"longest gap between completions {gap:.2f} s at +{gap_at - t0:.1f} s, after: "
                     f"{during(lines, gap_at)}",
                     f"longest gap between tokens {tgap:.2f} s at +{tgap_at - t0:.1f} s, after: "
                     f"{during(lines, tgap_at)}"] if lines else []}
    return fig, out.output


def alone_floor(url: str, key: str | None, concurrency: int, seconds: float, window_s: float) -> str:
    """The same load on one replica alone for SECONDS, nothing changing, seen through every window
    as long as the update (WINDOW_S, 1 s apart): how often its longest gap between completions
    breaks the bound when no rollout runs at all. A rolling update of two replicas keeps one alone
    for most of its duration, so this is the best it can show; the update's own row above is one
    draw."""
    load = StreamingLoad(url, concurrency=concurrency, api_key=key, stagger_s=STAGGER_S).start()
    time.sleep(STAGGER_S + 5.0)
    t0 = time.monotonic()
    time.sleep(seconds)
    t1 = time.monotonic()
    res = load.stop()
    windows, over, median = windows_over(res.completions, t0, t1, window_s=window_s, bound_s=BOUND_S)
    done = sum(t0 <= t <= t1 for t in res.completions)
    return (f"floor: one replica alone ({url}, C={concurrency}, no switch) for {t1 - t0:.0f} s, {done / (t1 - t0):.2f} "
            f"completions/s, {res.failed} failed: of its {windows} windows of {window_s:.0f} s (the update's "
            f"duration), {over} ({100 * over / windows:.0f}%) hold a gap between completions over {BOUND_S:g} s; "
            f"median longest gap {median:.2f} s, longest {longest_gap(res.completions, t0, t1)[0]:.2f} s")


def _idle(seconds: float) -> Run:
    """The steady row's action: nothing changes for SECONDS (the load's own baseline)."""
    time.sleep(seconds)
    return Run(rc=0, output="")


def _other_under_load(url: str, key: str | None, seconds: float) -> Run:
    """The "alone" row's contention check: the other replica under a C=64 load (as during its own
    gate: 256 in, 32 out, all at once) for SECONDS."""
    other = StreamingLoad(url, concurrency=64, input_len=256, output_len=32, api_key=key, stagger_s=0.0,
                          range_ratio=1.0, seed=11).start()
    time.sleep(seconds)
    res = other.stop()
    return Run(rc=0 if res.failed == 0 else 1, output=f"C=64 on {url}: {res.completed} completed, {res.failed} failed")


def _rollback(on_line) -> Run:
    out = run(["make", "rollback", "ARGS=--data health_poll_s=0.5"])
    return Run(rc=out.returncode, output=out.stdout + out.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--settle-s", type=float, default=5.0, help="load before and after each switch (default 5)")
    ap.add_argument("--no-rollback", action="store_true", help="measure the update only")
    ap.add_argument("--floor-s", type=float, default=0.0,
                    help="after the update: one replica alone for this long (e.g. 300), and how its longest gap "
                         "looks through windows as long as the update (the best any rollout of one replica at a "
                         "time can do)")
    ap.add_argument("--contention", action="store_true",
                    help="one more row: one replica alone while the other takes a C=64 load (as its gate) on the "
                         "same CPUs")
    args = ap.parse_args(argv)

    up(1)
    twin = SimHost(1)
    twin.write_file(FAULTS, json.dumps(FAST_START))     # removed at the end: other benches time the start
    try:
        return _measure(args, twin)
    finally:
        twin.run(f"rm -f {FAULTS}", check=False)


def _measure(args, twin: SimHost) -> int:
    profiles = write_profiles(Path(tempfile.mkdtemp(prefix="rolling-profiles-")), VARIANTS)
    os.environ["DSV4_PROFILES_DIR"] = str(profiles)
    first = deploy(BASE, profiles_dir=profiles)
    if first.returncode != 0:
        print((first.stdout + first.stderr)[-3000:])
        print(f"rolling: cannot deploy {BASE} to start from (exit {first.returncode})", file=sys.stderr)
        return 1
    data = load_profile(BASE, profiles).data
    key = twin.run(f"cat {Layout.of(data).api_key_file}").stdout.strip() if data["server"].get("api_key") else None
    url = f"http://127.0.0.1:{data['server']['port']}"

    figures = []
    steady, _ = measured("steady (no switch, 30 s)", lambda on_line: _idle(30.0), url, key, args.concurrency,
                         args.settle_s)
    figures.append(steady)
    alone_url = replica_plan(data).replicas[0].url
    alone, _ = measured(f"one replica alone ({alone_url}, no switch, {ALONE_S:.0f} s)",
                        lambda on_line: _idle(ALONE_S), alone_url, key, args.concurrency, args.settle_s)
    figures.append(alone)
    if args.contention:
        other_url = replica_plan(data).replicas[1].url
        busy, _ = measured(f"one replica alone ({alone_url}), {other_url} under C=64, {ALONE_S:.0f} s",
                           lambda on_line: _other_under_load(other_url, key, ALONE_S), alone_url, key,
                           args.concurrency, args.settle_s)
        figures.append(busy)
    fig, out = measured(f"update {BASE} -> {CHANGED}",
                        lambda on_line: deploy_watching(CHANGED, on_line, profiles_dir=profiles), url, key,
                        args.concurrency, args.settle_s)
    figures.append(fig)
    if fig["rc"] != 0:
        print(out[-3000:])
    if not args.no_rollback:
        fig_rb, out_rb = measured("make rollback", _rollback, url, key, args.concurrency, args.settle_s)
        figures.append(fig_rb)
        if fig_rb["rc"] != 0:
            print(out_rb[-3000:])

    floor = None
    if args.floor_s:
        floor = alone_floor(alone_url, key, args.concurrency, args.floor_s, window_s=fig["duration_s"])

    print(f"| switch | exit | duration s | requests sent | completed | failed | max gap between completions s "
          f"| max gap between tokens s |")
    print("|---|---|---|---|---|---|---|---|")
    for f in figures:
        print(f"| {f['what']} | {f['rc']} | {f['duration_s']:.1f} | {f['sent']} | {f['completed']} | {f['failed']} "
              f"| {f['max_gap_s']:.2f} | {f['max_token_gap_s']:.2f} |")
        for e in f["errors"]:
            print(f"  {f['what']}: {e}")
    for f in figures:
        for w in f["where"]:
            print(f"{f['what']}: {w}")
    if floor:
        print(floor)
    u = next(f for f in figures if f["what"].startswith("update"))
    print(f"rolling: failed_requests={u['failed']} max_gap_s={u['max_gap_s']:.2f} duration_s={u['duration_s']:.1f}")
    return 0 if all(f["rc"] == 0 for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
