"""Totals, the JSON report, the Markdown summary and expected-status files."""
import collections
import json
import re

from .harness import STATUSES

ALL_STATUSES = STATUSES + ("skipped",)


# --------------------------------------------------------------------------
# Totals


def grad_record(rec):
    """The gradient record of a float32 node of an autograd OpInfo."""
    if "grad" in rec:
        return rec["grad"]
    # No gradient record: the node crashed (or the harness failed) before it,
    # or its outputs are random.
    return {"status": rec["status"]} if rec["status"] in ("crash", "error", "skipped") else None


def loose_status(rec):
    """The status under test_compare_cpu's tolerance (atol=rtol=1e-3)."""
    return rec.get("status_1e-3") or rec["status"]


def _count(recs):
    c = collections.Counter(r["status"] for r in recs)
    out = {s: c.get(s, 0) for s in ALL_STATUSES}
    out["total"] = sum(out[s] for s in STATUSES)
    out["pass_rate"] = round(out["pass"] / out["total"], 4) if out["total"] else None
    out["pass_1e-3"] = sum(1 for r in recs if r["status"] != "skipped" and loose_status(r) == "pass")
    for kind in ("ties", "closer_to_f64"):  # passing nodes with a sample that differs from the CPU
        out[f"pass_{kind}"] = sum(1 for r in recs if r["status"] == "pass" and kind in r.get("explained", {}))
    return out


def totals(results, dtypes, autograd_keys):
    by_dtype = {}
    everything = []
    skipped_reasons = collections.Counter()
    for dt in dtypes:
        sts = [recs[dt] for recs in results.values() if dt in recs]
        by_dtype[dt] = _count(sts)
        everything += sts
    for recs in results.values():
        for dt, r in recs.items():
            if r["status"] == "skipped":
                skipped_reasons[r.get("skip_reason", "?")] += 1
    grads = []
    for key, recs in results.items():
        if key in autograd_keys and "float32" in recs:
            g = grad_record(recs["float32"])
            if g is not None:
                grads.append(g)
    allc = _count(everything)
    allc["skipped_by_reason"] = dict(skipped_reasons)
    return {"all": allc, "by_dtype": by_dtype, "grad": _count(grads)}


def summary_line(tot):
    a = tot["all"]
    return f"{a['pass']} passing (op, dtype) nodes of {a['total']}"


# --------------------------------------------------------------------------
# Grouping failures for the people fixing ops


def _strip_sample(msg):
    return re.sub(r"\s*\[sample \d+ .*$", "", msg or "").strip()


def normalize(msg):
    """A message with its sample, numbers and shapes taken out: for grouping."""
    m = _strip_sample(msg)
    m = re.sub(r"\[[0-9, ]*\]", "[...]", m)
    m = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", m)
    return m[:160]


def mismatch_kind(msg):
    m = _strip_sample(msg)
    for needle, kind in (("dtype", "wrong dtype"), ("shape", "wrong shape"), ("on device", "result on wrong device"),
                         ("values on tpu", "wrong number of outputs"), ("differentiable outputs", "wrong autograd structure"),
                         ("Mismatched elements", "values differ"), ("expected a tensor", "wrong output type")):
        if needle in m:
            return kind
    return "values differ"


def failures(results, autograd_keys):
    """[(key, dtypes, status, message, is_grad)] for mismatch/error/crash, the
    dtypes with the same status and message merged."""
    rows = []
    for key, recs in results.items():
        merged = collections.OrderedDict()
        for dt, r in recs.items():
            for part, is_grad in ((r, False), (r.get("grad") if dt == "float32" else None, True)):
                if not part or part["status"] not in ("mismatch", "error", "crash"):
                    continue
                st = part["status"]
                if st == "mismatch" and loose_status(part) != "mismatch":
                    st = "mismatch (within 1e-3)"
                merged.setdefault((st, _strip_sample(part.get("message", "")), is_grad), []).append(
                    (dt, part.get("message", "")))
        for (st, _, is_grad), items in merged.items():
            rows.append((key, [d for d, _ in items], st, items[0][1], is_grad))
    return rows


def explained(results):
    """[(key, dtypes, kind, message, is_grad)] for passing nodes with a sample
    that differs from the CPU (harness.explain), the dtypes merged."""
    rows = []
    for key, recs in results.items():
        merged = collections.OrderedDict()
        for dt, r in recs.items():
            for part, is_grad in ((r, False), (r.get("grad") if dt == "float32" else None, True)):
                if part and part.get("status") == "pass":
                    for kind, msg in part.get("explained", {}).items():
                        merged.setdefault((kind, is_grad), []).append((dt, msg))
        for (kind, is_grad), items in merged.items():
            rows.append((key, [d for d, _ in items], kind, items[0][1], is_grad))
    return rows


def missing_ops(results):
    """({aten op: number of nodes (forward and gradient) it leaves
    unsupported}, {aten op: [OpInfo keys]})."""
    c = collections.Counter()
    where = collections.defaultdict(list)
    for key, recs in results.items():
        for r in recs.values():
            for part in (r, r.get("grad")):
                if part and part.get("status") == "unsupported":
                    name = _strip_sample(part.get("message", "")).split()[0] if part.get("message") else "?"
                    c[name] += 1
                    if key not in where[name]:
                        where[name].append(key)
    return c, where


def dtype_class(dtypes):
    kinds = {"float32" if d == "float32" else "bf16/fp16" if d in ("bfloat16", "float16") else "int/bool"
             for d in dtypes}
    return "/".join(sorted(kinds))


# --------------------------------------------------------------------------
# Writers


def _slim(rec):
    """A node record without what repeats: zero sample counts, the
    per-outcome messages that equal the main message, empty overrides."""
    out = {}
    for k, v in rec.items():
        if k == "samples":
            v = {n: c for n, c in v.items() if c}
        elif k == "messages":
            v = {n: m for n, m in v.items() if m != rec.get("message") and n != "mismatch_far"}
            if not v:
                continue
        elif k == "tol_override" and not any(v):
            continue
        elif k == "grad":
            v = _slim(v)
        elif k == "status_1e-3" and v == rec.get("status"):
            continue
        out[k] = v
    return out


def write_json(path, report):
    """The report, one line per OpInfo under "results" (readable diffs)."""
    with open(path, "w") as f:
        f.write("{\n")
        for k in ("meta", "summary", "totals"):
            f.write(f" {json.dumps(k)}: {json.dumps(report[k], sort_keys=False)},\n")
        f.write(' "results": {')
        items = list(report["results"].items())
        for i, (key, recs) in enumerate(items):
            slim = {dt: _slim(r) for dt, r in recs.items()}
            f.write(("\n  " if i == 0 else ",\n  ") + f"{json.dumps(key)}: {json.dumps(slim)}")
        f.write("\n }\n}\n")


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def _md_escape(s):
    return (s or "").replace("|", "\\|").replace("\n", " ")


def markdown(report, command):
    meta = report["meta"]
    tot = report["totals"]
    results = report["results"]
    autograd = set(meta.get("autograd_ops", []))
    a = tot["all"]
    lines = []
    w = lines.append
    w("# Op conformance: PyTorch's OpInfo database on \"tpu\"")
    w("")
    w(f"Generated {meta['date']} with torch {meta['torch']}, torch-pjrt commit {meta.get('commit', '?')}, "
      f"plugin {meta.get('plugin', '?')}; {meta['opinfos']} OpInfos, dtypes {', '.join(meta['dtypes'])}, "
      f"gradients {'on' if meta['grad'] else 'off'}, {meta['workers']} worker(s), "
      f"{meta['timeout']:.0f} s per node, {meta['wall_seconds'] / 60:.1f} min.")
    w("")
    w(f"Regenerate from the repository root with the venv's Python (this run: {meta['wall_seconds'] / 60:.0f} "
      f"min on 2 cores); the CI subset (tests/conformance/ci_ops.txt, checked against "
      f"tests/conformance/expected.json by tests/test_conformance_subset.py) with the second command:")
    w("")
    w("```sh")
    w(command)
    w("python -m tests.conformance --ci --workers 2 --check-expected    # --update-expected rewrites expected.json")
    w("python -m tests.conformance --compiled --workers 2 --max-samples 3 --json compiled.json    "
      "# the tpu side through torch.compile (not in this report)")
    w("```")
    w("")
    w(f"**{summary_line(tot)}** ({_pct(a['pass_rate'])}); gradients at float32: "
      f"**{tot['grad']['pass']} of {tot['grad']['total']}** autograd OpInfos pass "
      f"({_pct(tot['grad']['pass_rate'])}). With PyTorch's test_compare_cpu tolerance (atol = rtol = "
      f"1e-3, raised by the OpInfo's overrides) instead: {a['pass_1e-3']} of {a['total']} nodes and "
      f"{tot['grad']['pass_1e-3']} of {tot['grad']['total']} gradients. "
      f"{a['skipped']} nodes are skipped and not counted ("
      + ", ".join(f"{n} {k}" for k, n in sorted(a.get("skipped_by_reason", {}).items())) + ").")
    w("")
    w("A node is one (OpInfo, dtype) pair, for the dtypes among float32, bfloat16, float16, int64, int32 "
      "and bool that the OpInfo supports on CPU. Each of its `sample_inputs` runs on the CPU and, moved "
      "to \"tpu\", on the device; results must match in structure, dtype and shape, and in value within "
      "`assert_close`'s default tolerance for the dtype, loosened to the loosest `toleranceOverride` the "
      "OpInfo declares for that dtype in PyTorch's suites (NaNs equal; integers and bools exactly). "
      "Mismatches that pass with PyTorch's test_compare_cpu tolerance (1e-3) are marked "
      "\"within 1e-3\"; the \"pass at 1e-3\" columns count them as passing. "
      "Status of a node: **pass** (every sample matches); "
      "**unsupported** (an op has no lowering: our NotImplementedError, or PyTorch's dispatcher "
      "finding no kernel for a tpu sparse layout; also any other NotImplementedError raised inside "
      "torch_pjrt, such as an unsupported dtype); **mismatch** (a result differs); "
      "**error** (any other exception on \"tpu\"); **crash** (the worker process died or hung; each "
      "OpInfo runs in a worker subprocess). A node with samples in several states takes the worst: "
      "mismatch, then error, then unsupported. **skipped**: OpInfos with random or uninitialized "
      "outputs (bernoulli, dropout, rand_like, empty...; they still run on \"tpu\" and their output "
      "shapes and dtypes are checked, see the message), samples whose CPU output differs between two "
      "seeds, and nodes where the CPU reference itself raised on every sample; they are not in the totals. "
      "Gradients: float32 OpInfos with `supports_autograd`, gradients of every input that requires grad "
      "for a fixed random cotangent, compared the same way.")
    w("")
    w("A sample whose result differs from the CPU's still passes in two cases, listed in their own "
      "section below: **ties**, where only the index among equal elements differs and PyTorch leaves "
      "that choice unspecified (sort and argsort unless stable=True, topk, kthvalue, mode, median, "
      "nanmedian; the indices must select the CPU's values, once each), and **closer to float64**, "
      "where the op, run once more on the CPU with its floating inputs in float64, shows the tpu "
      "result at least as accurate as the CPU's: the worst tpu element is off from the float64 "
      "result by no more than the worst CPU element, plus one unit of the node's tolerance. "
      f"Nodes passing this way: {a['pass_ties']} by ties, {a['pass_closer_to_f64']} closer to float64 "
      f"(gradients: {tot['grad']['pass_closer_to_f64']}).")
    w("")
    w("## Totals by dtype")
    w("")
    w("| dtype | nodes | pass | unsupported | mismatch | error | crash | pass rate | pass at 1e-3 | skipped |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dt, c in list(tot["by_dtype"].items()) + [("**all**", a)]:
        w(f"| {dt} | {c['total']} | {c['pass']} | {c['unsupported']} | {c['mismatch']} | {c['error']} | "
          f"{c['crash']} | {_pct(c['pass_rate'])} | {c['pass_1e-3']} | {c['skipped']} |")
    g = tot["grad"]
    w("")
    w("## Gradients (float32, OpInfos with supports_autograd)")
    w("")
    w("| nodes | pass | unsupported | mismatch | error | crash | pass rate | pass at 1e-3 | skipped |")
    w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    w(f"| {g['total']} | {g['pass']} | {g['unsupported']} | {g['mismatch']} | {g['error']} | {g['crash']} | "
      f"{_pct(g['pass_rate'])} | {g['pass_1e-3']} | {g['skipped']} |")

    fails = failures(results, autograd)
    w("")
    w("## Most frequent failures")
    w("")
    w("Errors and crashes grouped by message (numbers and shapes taken out), mismatches by kind and "
      "dtype class; the nodes column counts forward and gradient checks.")
    w("")
    w("| status | nodes | OpInfos | pattern | example |")
    w("|---|---:|---:|---|---|")
    groups = collections.OrderedDict()
    for key, dts, st, msg, is_grad in fails:
        if st.startswith("mismatch"):
            pat = f"{mismatch_kind(msg)}, {dtype_class(dts)}{st[len('mismatch'):]}"
        else:
            pat = normalize(msg)
        pat = ("grad: " if is_grad else "") + pat
        gkey = (st, pat)
        if gkey not in groups:
            groups[gkey] = {"nodes": 0, "ops": set(), "example": f"{key} ({', '.join(dts)}): {msg}"}
        groups[gkey]["nodes"] += len(dts)
        groups[gkey]["ops"].add(key)
    top = sorted(groups.items(), key=lambda kv: (-kv[1]["nodes"], kv[0]))
    for (st, pat), gi in top[:40]:
        w(f"| {st} | {gi['nodes']} | {len(gi['ops'])} | {_md_escape(pat)} | {_md_escape(gi['example'][:300])} |")
    if len(top) > 40:
        w(f"\n{len(top) - 40} more patterns: see the full list below.")

    miss, miss_where = missing_ops(results)
    w("")
    w("## Missing lowerings")
    w("")
    w("ATen ops named by \"not currently implemented for the tpu device\", by the number of nodes "
      "(forward and gradient) they leave unsupported.")
    w("")
    w("| ATen op | nodes | OpInfos |")
    w("|---|---:|---|")
    for name, n in miss.most_common():
        ops = miss_where[name]
        w(f"| `{name}` | {n} | {', '.join(ops[:5])}{', ...' if len(ops) > 5 else ''} |")

    w("")
    w("## Passing results that differ from the CPU")
    w("")
    w("| OpInfo | dtypes | why it passes | first differing sample |")
    w("|---|---|---|---|")
    for key, dts, kind, msg, is_grad in sorted(explained(results), key=lambda r: (r[0], r[4])):
        why = "ties" if kind == "ties" else "closer to float64"
        w(f"| {key} | {', '.join(dts)}{' (grad)' if is_grad else ''} | {why} | {_md_escape(msg[:300])} |")
    w("")
    w("## Every mismatch, error and crash")
    w("")
    w("One row per OpInfo and distinct failure; the message is the first failing sample's.")
    w("")
    w("| OpInfo | dtypes | status | message |")
    w("|---|---|---|---|")
    for key, dts, st, msg, is_grad in sorted(fails, key=lambda r: (r[0], r[4])):
        w(f"| {key} | {', '.join(dts)}{' (grad)' if is_grad else ''} | {st} | {_md_escape(msg)} |")
    w("")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Expected statuses (the CI subset)


def expected_from(results):
    """{key: {"float32": status, "float32:grad": status, ...}}"""
    out = {}
    for key in sorted(results):
        recs = results[key]
        e = {}
        for dt, r in recs.items():
            e[dt] = r["status"]
            if "grad" in r:
                e[f"{dt}:grad"] = r["grad"]["status"]
        out[key] = e
    return out


def compare_expected(results, expected):
    """(regressions, new_passes, other_changes): lists of text lines.  A
    regression is a node expected to pass that does not."""
    got = expected_from(results)
    regress, new_pass, other = [], [], []
    for key, exp in sorted(expected.items()):
        g = got.get(key, {})
        for node, st in sorted(exp.items()):
            now = g.get(node)
            if now == st:
                continue
            detail = ""
            dt, _, part = node.partition(":")
            rec = results.get(key, {}).get(dt)
            if rec is not None:
                rec = rec.get("grad") if part else rec
                if rec:
                    detail = f": {rec.get('message', '')}"
            line = f"{key} {node}: expected {st}, got {now}{detail}"
            if st == "pass":
                regress.append(line)
            elif now == "pass":
                new_pass.append(line)
            else:
                other.append(line)
    for key, g in sorted(got.items()):
        for node, st in sorted(g.items()):
            if node not in expected.get(key, {}):
                (new_pass if st == "pass" else other).append(f"{key} {node}: not in expected.json, got {st}")
    return regress, new_pass, other
