"""Tables of NCCL probe results, on the control node (the probe itself, nccl_probe.py, stays small
and standard-library only on the GPU host; these read the JSON documents it prints).

    format_compare(runs)   one column pair per preset: latency and bus bandwidth per size
    format_groups(doc)     a `launch --groups` document: each group at once next to itself alone
"""

from __future__ import annotations

from dsv4deploy.preflight.nccl_probe import human_size, text_grid


def _at(res: dict, size: int) -> dict | None:
    return next((x for x in res["results"] if x["bytes"] == size), None)


def _status(res: dict) -> str:
    return "ok" if res["ok"] else res["error"]["kind"]


def format_compare(results: list[dict]) -> str:
    """Side-by-side table of several results (one column pair per preset/label)."""
    sizes = sorted({x["bytes"] for res in results for x in res["results"]})
    head = ["size"]
    for res in results:
        head += [f"{res['label']} us", f"{res['label']} GB/s"]
    rows = [tuple(head)]
    for size in sizes:
        row = [human_size(size)]
        for res in results:
            x = _at(res, size)
            row += ([f"{x['latency_us']:.1f}", f"{x['busbw_gbps']:.2f}" + ("" if x["correct"] else "!")]
                    if x else ["-", "-"])
        rows.append(tuple(row))
    status = ["status"]
    for res in results:
        status += [_status(res), f"{res['elapsed_s']:.1f} s"]
    rows.append(tuple(status))
    lines = ["NCCL all-reduce, latency (us, max over ranks) and bus bandwidth (GB/s)"]
    lines += text_grid(rows, right=set(range(1, len(head))))
    for res in results:
        if not res["ok"]:
            lines.append(f"{res['label']}: {res['error']['message']}")
    return "\n".join(lines) + "\n"


def format_groups(doc: dict) -> str:
    """Each group's latency and bus bandwidth with all groups running at once, next to the same
    group's bus bandwidth alone, and their ratio (at once / alone: below 1, the groups slow each
    other down, e.g. through shared PCIe switches or host memory)."""
    together, alone = doc["together"]["runs"], {r["group"]: r for r in doc["alone"]}
    sizes = sorted({x["bytes"] for res in [*together, *alone.values()] for x in res["results"]})
    head, right = ["size"], set()
    for res in together:
        g = f"g{res['group']}"
        head += [f"{g} us", f"{g} GB/s"] + ([f"{g} alone GB/s", f"{g} ratio"] if res["group"] in alone else [])
    rows = [tuple(head)]
    for size in sizes:
        row = [human_size(size)]
        for res in together:
            x = _at(res, size)
            row += [f"{x['latency_us']:.1f}", f"{x['busbw_gbps']:.2f}" + ("" if x["correct"] else "!")] \
                if x else ["-", "-"]
            if res["group"] in alone:
                y = _at(alone[res["group"]], size)
                row.append(f"{y['busbw_gbps']:.2f}" + ("" if y["correct"] else "!") if y else "-")
                row.append(f"{x['busbw_gbps'] / y['busbw_gbps']:.2f}" if x and y and y["busbw_gbps"] else "-")
        rows.append(tuple(row))
    status = ["status"]
    for res in together:
        status += [_status(res), f"{res['elapsed_s']:.1f} s"]
        if res["group"] in alone:
            status += [f"{_status(alone[res['group']])} {alone[res['group']]['elapsed_s']:.1f} s", ""]
    rows.append(tuple(status))
    sets = "; ".join(f"g{r['group']} GPUs {','.join(map(str, r['gpus']))}" for r in together)
    label = f" [{doc['label']}]" if doc.get("label") else ""
    lines = [f"NCCL all-reduce{label}, {len(together)} groups at once ({sets})"
             + (", each also alone" if alone else "") + ": latency (us, max over ranks), bus bandwidth (GB/s)"
             + (", ratio at once / alone" if alone else "")]
    lines += text_grid(rows, right=set(range(1, len(head))))
    conc = doc["together"]
    lines.append(f"at once: {'OK' if conc['ok'] else 'FAILED'} in {conc['elapsed_s']:.1f} s (cleanup "
                 f"{conc['cleanup_s']:.1f} s), {len(conc['leftover'])} process(es) left")
    for res in together:
        if not res["ok"]:
            lines.append(f"g{res['group']} at once: {res['error']['message']}")
    for res in alone.values():
        if not res["ok"]:
            lines.append(f"g{res['group']} alone: {res['error']['message']}")
    return "\n".join(lines) + "\n"
