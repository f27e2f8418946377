#!/usr/bin/env python3
"""The Ready hop of a benchmark round's probe stacks (p*) and floor stacks (f*), from the API
server's own timestamps in the audit log `hack/testenv.sh` keeps: the provider's second status
update of the control plane's Workspace (the pass that reports Ready=True with the output)
completed -> the next status patch of the CAPTControlPlane by capt-captcontrolplane (ours) or
capt-floor (the floor) received and completed, how long the API server took over it, and how
many of those were preceded by a 409 or a GET of the control plane. `hack/bench.sh` restarts the
environment between rounds, so run it on a round's log before the next round starts (or run one
mode and one N).

usage: hack/ready-hop.py .benchenv/audit.log bench-100-sidecar
"""
import collections
import json
import sys
from datetime import datetime


def ts(s):
    return datetime.strptime(s.rstrip("Z")[:26], "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def manager(event):
    uri = event["requestURI"]
    return uri.split("fieldManager=")[1].split("&")[0] if "fieldManager=" in uri else ""


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p * (len(values) - 1))))]


def main(audit, ns):
    per_stack = collections.defaultdict(list)
    with open(audit) as log:
        for line in log:
            if ns not in line:
                continue
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("stage") != "ResponseComplete":
                continue
            o = e.get("objectRef", {})
            name = o.get("name") or ""
            if o.get("resource") == "workspaces":
                if name.startswith(f"floor-{ns}-"):
                    stack = name[len(f"floor-{ns}-"):]
                elif name.startswith(f"{ns}-p") and "-controlplane-" in name:
                    stack = name[len(ns) + 1:].split("-controlplane-")[0]
                else:
                    continue
            elif o.get("resource") == "captcontrolplanes" and o.get("namespace") == ns and name[:1] in "pf":
                stack = name
            else:
                continue
            per_stack[stack].append(e)
    hops = {"p": [], "f": []}
    for stack, events in per_stack.items():
        events.sort(key=lambda e: e["requestReceivedTimestamp"])
        updates = [i for i, e in enumerate(events)
                   if e["objectRef"]["resource"] == "workspaces" and e["objectRef"].get("subresource") == "status"
                   and e["verb"] == "update" and e["responseStatus"].get("code") == 200]
        if len(updates) < 2:
            continue
        t0 = ts(events[updates[1]]["stageTimestamp"])
        wanted = "capt-floor" if stack[0] == "f" else "capt-captcontrolplane"
        refused = reads = 0
        for e in events[updates[1] + 1:]:
            if e["objectRef"]["resource"] != "captcontrolplanes":
                continue
            if e["verb"] == "get":
                reads += 1
            elif e["objectRef"].get("subresource") == "status" and e["verb"] == "patch" and manager(e) == wanted:
                if e["responseStatus"].get("code") == 409:
                    refused += 1
                elif e["responseStatus"].get("code") == 200:
                    hops[stack[0]].append(((ts(e["requestReceivedTimestamp"]) - t0) * 1000,
                                           (ts(e["stageTimestamp"]) - t0) * 1000, refused, reads))
                    break
    for key, label in (("p", "ours"), ("f", "the floor")):
        h = hops[key]
        if not h:
            print(f"{label}: no stack")
            continue
        received, done = [x[0] for x in h], [x[1] for x in h]
        print(f"{label}: {len(h)} stacks; the provider's Ready write completed -> status patch received "
              f"p50 {pct(received, .5):.1f} max {max(received):.1f} ms; completed p50 {pct(done, .5):.1f} "
              f"p90 {pct(done, .9):.1f} p99 {pct(done, .99):.1f} max {max(done):.1f} ms; the API server's handling of it "
              f"p50 {pct([d - r for r, d in zip(received, done)], .5):.1f} ms; after a 409: {sum(1 for x in h if x[2])}, "
              f"after a GET: {sum(1 for x in h if x[3])}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
