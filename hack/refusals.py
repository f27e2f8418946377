#!/usr/bin/env python3
"""Why the API server refused our status-applier's applies (409 Conflict on the
resourceVersion precondition), from the API server's own audit log (`hack/testenv.sh` keeps
one; a benchmark round's is `.benchenv/audit.log` until the next round replaces it).

An apply carries the resourceVersion of the view it was planned on (docs/concurrency.md,
guarantee 1), and is refused when the object changed since. For each refused apply this
names the write that changed it: the last successful write to the same object completed
before the refused request was received, by its field manager (else its program) and
subresource. It prints the refusals by our manager and that writer, with how long before the
refusal that write completed, and what followed each refusal (the applier's read and its next
apply of the same object and manager).

usage: hack/refusals.py AUDIT_LOG [NAMESPACE_PREFIX]
"""
import collections
import json
import sys
from datetime import datetime

WRITES = {"create", "update", "patch", "delete"}


def ts(s):
    return datetime.strptime(s.rstrip("Z")[:26], "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def writer(event):
    uri = event.get("requestURI", "")
    if "fieldManager=" in uri:
        return uri.split("fieldManager=")[1].split("&")[0]
    agent = event.get("userAgent", "")
    return "(no manager: " + agent.split("/")[0] + ")"


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p * (len(values) - 1))))]


def read(audit, prefix):
    """Completed requests on namespaced objects of namespaces starting with `prefix`, by
    object, in the order the API server completed them."""
    by_object = collections.defaultdict(list)
    with open(audit) as log:
        for line in log:
            if prefix and prefix not in line:
                continue
            try:
                e = json.loads(line)
            except ValueError:
                continue
            o = e.get("objectRef") or {}
            if e.get("stage") != "ResponseComplete" or not o.get("name"):
                continue
            if prefix and not (o.get("namespace") or "").startswith(prefix):
                continue
            key = (o.get("resource"), o.get("namespace"), o["name"])
            by_object[key].append(e)
    for events in by_object.values():
        events.sort(key=lambda e: e["stageTimestamp"])
    return by_object


def main(audit, prefix=""):
    causes = collections.Counter()
    gaps = collections.defaultdict(list)
    followed = collections.Counter()
    refused = 0
    for (resource, _ns, _name), events in read(audit, prefix).items():
        for i, e in enumerate(events):
            code = (e.get("responseStatus") or {}).get("code")
            ours = writer(e)
            if e["verb"] != "patch" or code != 409 or not ours.startswith("capt-"):
                continue
            refused += 1
            received = ts(e["requestReceivedTimestamp"])
            sub = e["objectRef"].get("subresource") or "main"
            before = [
                w for w in events[:i]
                if w["verb"] in WRITES
                and ((w.get("responseStatus") or {}).get("code") or 0) < 300
                and ts(w["stageTimestamp"]) <= received
            ]
            if before:
                w = before[-1]
                cause = f"{writer(w)} {w['objectRef'].get('subresource') or 'main'}"
                gaps[(ours, sub, cause)].append((received - ts(w["stageTimestamp"])) * 1000)
            else:
                cause = "(no earlier write in the log)"
            causes[(ours, sub, cause)] += 1
            after = [
                x for x in events[i + 1:]
                if writer(x) == ours
                or (x["verb"] == "get" and x.get("userAgent", "").startswith("status-applier"))
            ]
            verbs = tuple(x["verb"] for x in after[:2])
            followed[verbs] += 1
    print(f"{refused} applies of ours refused with 409 in {audit}")
    print("| our manager | subresource | the write just before (manager, subresource) | refusals | "
          "that write completed before the refused request, p50 / max (ms) |")
    print("| --- | --- | --- | ---: | ---: |")
    for (ours, sub, cause), n in causes.most_common():
        g = gaps.get((ours, sub, cause)) or [float("nan")]
        print(f"| {ours} | {sub} | {cause} | {n} | {pct(g, 0.5):.1f} / {max(g):.1f} |")
    print("what followed each refusal on the same object (the next two requests of a GET or of the"
          " same manager):")
    for verbs, n in followed.most_common():
        print(f"  {' then '.join(verbs) or '(nothing)'}: {n}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
