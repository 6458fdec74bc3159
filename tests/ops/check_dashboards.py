#!/usr/bin/env python3
"""Checks packaging/host/grafana-dashboard.json and prometheus-alerts.yml against a real controller's /metrics.

    check_dashboards.py --metrics FILE [--dashboard FILE] [--rules FILE] [--require-samples NAME,...]

- the dashboard has what Grafana needs to import it: title, uid, schemaVersion, templating, panels with unique
  ids, a known type, a gridPos inside the 24-column grid that overlaps no other panel, and for every non-row
  panel a datasource and targets with unique refIds and a PromQL expression with balanced brackets; every
  $variable it uses is defined;
- every metric name the dashboard and the rules use is a family in FILE (HELP/TYPE lines), or a _bucket, _sum or
  _count series of a histogram family there;
- every label name they select, group by or template ({{ $labels.x }}) is on a sample of the families that
  expression uses, where FILE has labelled samples of them (else it is listed as not verifiable here);
- --require-samples: these series names must have a sample with a value above 0 (after a real recovery).
Prints what it checked; exits 1 on the first list of problems.
"""
import argparse
import json
import re
import sys

PANEL_TYPES = {"row", "timeseries", "stat", "table", "gauge", "bargauge", "text", "heatmap"}
NAME = re.compile(r"\bckpt_controller_[a-z_]+\b")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^{}]*)\}")
MATCHER_NAME = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
TEMPLATE_LABEL = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")
ADDED_BY_PROMETHEUS = {"instance", "job"}


def parse_metrics(text):
    """Families {name: type} and samples {series name: [(labels dict, value)]} of Prometheus' text format."""
    families, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            families[name] = kind.strip()
        elif line and not line.startswith("#"):
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)", line)
            if not m:
                raise SystemExit("unparsable /metrics line: %r" % line)
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            samples.setdefault(m.group(1), []).append((labels, float(m.group(4))))
    return families, samples


def family_of(name, families):
    if name in families:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and families.get(base) == "histogram":
            return base
    return None


def balanced(expr):
    depth = {"(": 0, "{": 0, "[": 0}
    close = {")": "(", "}": "{", "]": "["}
    in_string = False
    for i, c in enumerate(expr):
        if c == '"' and (i == 0 or expr[i - 1] != "\\"):
            in_string = not in_string
        elif not in_string and c in depth:
            depth[c] += 1
        elif not in_string and c in close:
            depth[close[c]] -= 1
            if depth[close[c]] < 0:
                return False
    return not in_string and all(v == 0 for v in depth.values())


def check_layout(dash, problems):
    for key, kind in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list), ("templating", dict)):
        if not isinstance(dash.get(key), kind):
            problems.append("dashboard: '%s' missing or not a %s" % (key, kind.__name__))
    if problems:
        return []
    if len(dash["uid"]) > 40:
        problems.append("dashboard: uid longer than 40 characters")
    ids, cells, queries = set(), {}, []
    for p in dash["panels"]:
        where = "panel %s (%s)" % (p.get("id"), p.get("title"))
        if not isinstance(p.get("id"), int) or p["id"] in ids:
            problems.append(where + ": id missing or not unique")
        ids.add(p.get("id"))
        if p.get("type") not in PANEL_TYPES or not isinstance(p.get("title"), str):
            problems.append(where + ": unknown type or no title")
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "hwxy") or g["x"] < 0 or g["x"] + g["w"] > 24:
            problems.append(where + ": gridPos missing or outside the 24 columns")
            continue
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    problems.append(where + ": overlaps panel %s" % cells[(x, y)])
                    break
                cells[(x, y)] = p["id"]
        if p["type"] == "row":
            continue
        if not isinstance(p.get("datasource"), dict) or not p["datasource"].get("uid"):
            problems.append(where + ": no datasource")
        targets = p.get("targets")
        if not isinstance(targets, list) or not targets:
            problems.append(where + ": no targets")
            continue
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or not all(refs):
            problems.append(where + ": refIds missing or not unique")
        for t in targets:
            if not isinstance(t.get("expr"), str) or not balanced(t["expr"]):
                problems.append(where + ": expression missing or unbalanced: %r" % t.get("expr"))
            else:
                queries.append((where, t["expr"], t.get("legendFormat", "")))
    return queries


def check_variables(dash, problems):
    defined = {v.get("name") for v in dash["templating"].get("list", [])}
    text = json.dumps(dash["panels"]) + json.dumps(dash["templating"])
    used = set(re.findall(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)", text)) - {"__rate_interval", "__interval", "__range"}
    for name in sorted(used - defined):
        problems.append("dashboard: variable $%s is used but not defined" % name)
    return sorted(defined)


def rule_queries(path, problems):
    """(where, expr, templates) of each rule; the rules file is YAML, read with a small reader of its own shape."""
    try:
        import yaml  # python3-yaml, when installed
        doc = yaml.safe_load(open(path))
        rules = [r for g in doc["groups"] for r in g["rules"]]
        return [("rule " + r.get("alert", r.get("record", "?")), r["expr"],
                 " ".join(str(v) for v in r.get("annotations", {}).values())) for r in rules]
    except ImportError:
        pass
    text = open(path).read()
    out = []
    for block in re.split(r"\n\s*- alert: ", text)[1:]:
        name = block.split("\n", 1)[0].strip()
        m = re.search(r"expr: \|?\s*\n?(.*?)\n\s*(?:for|labels):", block, re.S)
        if not m:
            problems.append("rule %s: no expr found" % name)
            continue
        out.append(("rule " + name, " ".join(m.group(1).split()), block))
    return out


def check_names(queries, families, samples, problems):
    """Returns (metric names checked, label uses verified, label uses not verifiable here)."""
    names, verified, unverifiable = set(), set(), set()
    for where, expr, templates in queries:
        used = set(NAME.findall(expr))
        fams = set()
        for n in used:
            f = family_of(n, families)
            if f is None:
                problems.append("%s: metric %s is not in /metrics" % (where, n))
            else:
                names.add(n)
                fams.add(f)
        labels = set()
        for group in GROUPING.findall(expr):
            labels |= {x.strip() for x in group.split(",") if x.strip()}
        for inner in MATCHERS.findall(expr):
            labels |= set(MATCHER_NAME.findall(inner))
        labels |= set(TEMPLATE_LABEL.findall(templates))
        labels |= set(re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", templates))
        seen = set()
        series = [s for n in used for s in samples.get(n, [])]
        for labelset, _ in series:
            seen |= set(labelset)
        for label in sorted(labels - ADDED_BY_PROMETHEUS):
            if label in seen:
                verified.add((label, ",".join(sorted(fams))))
            elif not seen:
                unverifiable.add((label, ",".join(sorted(fams))))
            else:
                problems.append("%s: label '%s' is on no sample of %s" % (where, label, ",".join(sorted(used))))
    return names, verified, unverifiable


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--dashboard", default="packaging/host/grafana-dashboard.json")
    ap.add_argument("--rules", default="packaging/host/prometheus-alerts.yml")
    ap.add_argument("--require-samples", default="")
    args = ap.parse_args()
    problems = []
    families, samples = parse_metrics(open(args.metrics).read())
    dash = json.load(open(args.dashboard))
    queries = check_layout(dash, problems)
    variables = check_variables(dash, problems) if not problems else []
    panel_count = len([p for p in dash.get("panels", []) if p.get("type") != "row"])
    rules = rule_queries(args.rules, problems)
    names, verified, unverifiable = check_names(queries + rules, families, samples, problems)
    for name in filter(None, args.require_samples.split(",")):
        if not any(v > 0 for _, v in samples.get(name, [])):
            problems.append("/metrics has no sample of %s above 0" % name)
    print("dashboard: %d panels, %d queries, variables %s" % (panel_count, len(queries), ",".join(variables)))
    print("rules: %d alerts" % len(rules))
    print("/metrics: %d families, %d series" % (len(families), sum(len(v) for v in samples.values())))
    print("metric names used and found: %s" % " ".join(sorted(names)))
    print("label uses verified on samples: %s" % " ".join("%s(%s)" % x for x in sorted(verified)))
    if unverifiable:
        print("label uses not verifiable here (no labelled samples yet): %s" %
              " ".join("%s(%s)" % x for x in sorted(unverifiable)))
    if args.require_samples:
        print("samples above 0: %s" % " ".join(
            "%s=%g" % (n, max(v for _, v in samples.get(n, [({}, 0)]))) for n in args.require_samples.split(",")))
    for p in problems:
        print("PROBLEM: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
