#!/usr/bin/env bash
# The run report in a real browser: a single-site run and a three-site world (atoll launch, which
# writes the report itself), each report opened in headless Chromium. Every chart must have
# rendered with the series and points the run's files call for (counted here, independently, from
# metrics.jsonl), the page must have logged no error, and a screenshot is saved (into $OUT when
# set, for the docs: REPORT_SCREENSHOT=docs/report.png). Skipped (77), saying why, where Chromium
# is not installed (scripts/setup.sh installs it) or Chart.js is missing.
set -euo pipefail
source "$(dirname "$0")/e2e_lib.sh"
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $CHROMIUM ]]; then
  echo "SKIP: no chromium (scripts/setup.sh installs Debian's chromium)" >&2
  exit 77
fi
if [[ ! -f ${ATOLL_CACHE_DIR:-.cache}/npm/node_modules/chart.js/dist/chart.umd.min.js ]]; then
  echo "SKIP: no Chart.js in .cache/npm (scripts/setup.sh installs it)" >&2
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_orte_tmpdir_base="$T"

# browse PAGE OUT_PREFIX: the page's self-test (its DOM after the scripts ran) and a screenshot.
browse() {
  local flags=(--headless=new --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$T/chrome")
  timeout 120 "$CHROMIUM" "${flags[@]}" --dump-dom "file://$1" >"$2.dom" 2>"$2.log" ||
    fail "chromium --dump-dom failed: $(tail -3 "$2.log")"
  timeout 120 "$CHROMIUM" "${flags[@]}" --window-size=1280,2400 --screenshot="$2.png" \
    "file://$1" >/dev/null 2>>"$2.log" || fail "chromium --screenshot failed: $(tail -3 "$2.log")"
  [[ -s "$2.png" ]] || fail "no screenshot"
}

# check DOM RUN_DIR: the self-test against the run's own files.
check() {
  python3 - "$1" "$2" <<'PY'
import glob, html, json, os, re, sys
dom, run = open(sys.argv[1]).read(), sys.argv[2]
m = re.search(r'<pre id="selftest">(.*?)</pre>', dom, re.S)
assert m, "the page did not finish its scripts (no self-test)"
got = json.loads(html.unescape(m.group(1)))
assert got["errors"] == [], f"the page logged errors: {got['errors']}"
dirs = [run] if os.path.exists(f"{run}/metrics.jsonl") else sorted(
    glob.glob(f"{run}/site-*"), key=lambda d: int(d.rsplit("-", 1)[1]))
rows = [[json.loads(l) for l in open(f"{d}/metrics.jsonl") if l.strip()] for d in dirs]
steps = [len(r) for r in rows]
vals = [sum("val_loss" in x for x in r) for r in rows]
def exchanges(r):
    n, last = 0, 0
    for x in r:
        o = x.get("outer_rounds", -1)
        if o > last or (o < 0 and x.get("wan_ms", 0) > 0): n += 1
        if o >= 0: last = o
    return n
col = lambda r, k: [x[k] for x in r if k in x]
# Each chart's series: (points drawn, sum of the y values), from the files.
loss = [(len(r), sum(col(r, "loss"))) for r in rows]
val = [(len(col(r, "val_loss")), sum(col(r, "val_loss"))) for r in rows]
want = {"loss-step": [p for l, v in zip(loss, val) for p in ([l, v] if v[0] else [l])],
        "loss-tokens": loss,
        "throughput": [(len(r), sum(col(r, "tokens_per_s"))) for r in rows]}
if len(dirs) > 1:
    share = [(len(r), sum(100 * x["wan_ms"] / x["step_ms"] if x["step_ms"] > 0 else 0 for x in r))
             for r in rows]
    want.update({"loss-wan": loss, "wan-share": share,
                 "timeline": [(exchanges(r), i * exchanges(r)) for i, r in enumerate(rows)]})
charts = {c["id"]: c for c in got["charts"]}
assert set(charts) == set(want), f"charts {sorted(charts)}, expected {sorted(want)}"
for cid, series in want.items():
    c = charts[cid]
    points, sums = [p for p, _ in series], [s for _, s in series]
    assert c["series"] == len(series) and c["points"] == points, f"{cid}: {c}, expected {points}"
    assert all(p > 0 for p in points), f"{cid}: an empty series {points}"
    for got_sum, want_sum in zip(c["ysum"], sums):
        assert abs(got_sum - want_sum) <= 1e-9 * max(1.0, abs(want_sum)), f"{cid}: y sums {c['ysum']}, expected {sums}"
    assert c["height"] > 100, f"{cid}: a canvas {c['height']} px high"
events = sum(1 for d in dirs if os.path.exists(f"{d}/events.jsonl")
             for l in open(f"{d}/events.jsonl") if l.strip())
if os.path.exists(f"{run}/coordinator.log"):
    events += sum(1 for l in open(f"{run}/coordinator.log")
                  if l.strip() and json.loads(l).get("t") not in ("round", "start"))
assert got["events"] == events, f"events {got['events']}, expected {events}"
# The planner's prediction against the measurement (atoll train writes plan.json: a header row
# and one row per part).
plan = f"{run}/plan.json" if os.path.exists(f"{run}/plan.json") else f"{dirs[0]}/plan.json"
want_rows = 1 + len(json.load(open(plan))) if os.path.exists(plan) else 0
assert want_rows == 5 and got["plan_rows"] == want_rows, f"plan rows {got['plan_rows']}, expected 5"
print(f"{run}: {len(charts)} charts, series {[charts[c]['series'] for c in sorted(charts)]}, "
      f"{events} events, no errors")
PY
}

# One site.
"$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" --set train.steps=8 \
  --set train.eval_every=4 --out "$T/one" -q >/dev/null 2>&1
"$ATOLL" report "$T/one" >"$T/one.path"
[[ $(cat "$T/one.path") == "$T/one/report.html" ]] || fail "report printed $(cat "$T/one.path")"
browse "$T/one/report.html" "$T/one"
check "$T/one.dom" "$T/one"

# A world of three sites; launch writes the report and names it on stderr.
"$ATOLL" launch --config configs/world-demo.toml --out "$T/world" --insecure -q \
  --set data.dir="$DATA" --set train.steps=24 --set train.eval_every=12 \
  >"$T/launch.out" 2>"$T/launch.err" || fail "launch: $(tail -5 "$T/launch.err")"
grep -q "launch: report: $T/world/report.html" "$T/launch.err" || fail "launch did not write the report"
browse "$T/world/report.html" "$T/world"
check "$T/world.dom" "$T/world"

# A synchronous world: an exchange (an all-reduce over the WAN) every step.
"$ATOLL" launch --config configs/world-demo.toml --out "$T/sync" --insecure -q \
  --set data.dir="$DATA" --set world.strategy=sync --set train.steps=5 --set train.eval_every=5 \
  >"$T/sync.out" 2>"$T/sync.err" || fail "launch (sync): $(tail -5 "$T/sync.err")"
browse "$T/sync/report.html" "$T/sync"
check "$T/sync.dom" "$T/sync"

# A page that breaks is caught: the self-test must see the error.
sed 's|JSON.parse(document.getElementById("atoll-data").textContent)|JSON.parse("{")|' \
  "$T/one/report.html" >"$T/broken.html"
browse "$T/broken.html" "$T/broken"
if check "$T/broken.dom" "$T/one" 2>/dev/null; then fail "a broken page passed the check"; fi

# Refusals: not a run directory.
expect_exit 2 "$ATOLL" report "$T/nothing"
expect_err "not a run directory"
mkdir -p "$T/empty"
expect_exit 2 "$ATOLL" report "$T/empty"
expect_err "no metrics.jsonl and no site-N/metrics.jsonl"

if [[ -n ${OUT:-} ]]; then cp "$T/world.png" "$OUT/report_world.png"; cp "$T/one.png" "$OUT/report_one.png"; fi
if [[ -n ${REPORT_SCREENSHOT:-} ]]; then cp "$T/world.png" "$REPORT_SCREENSHOT"; fi
echo PASS
