#!/usr/bin/env bash
# bench/ncu_table.py on a sample of Nsight Compute's CSV (bench/testdata/ncu_sample.csv: ncu's
# ==PROF== lines and the program's own output before the header, thousands separators, three
# units): the names shortened, calls and times summed per kernel, largest first, --per dividing;
# exit 2 for a file that is not ncu's CSV.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${1:-python3}
out=$("$py" "$here/ncu_table.py" "$here/testdata/ncu_sample.csv" --per 2)
echo "$out"
fail() { echo "ncu_table_test: $1" >&2; exit 1; }
rows=$(grep -c '^| `' <<<"$out") || true
[[ $rows == 3 ]] || fail "3 kernels expected, got $rows"
# 0.9 ms over 2 steps; 2 calls of 290 and 310 us: 1 a step, 300 a step, mean 300; 40 us once.
grep -qxF '| `nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNT` | 0.5 | 450.0 | 900.0 | 58.4% |' <<<"$out" || fail "nvjet row"
grep -qxF '| `TcForward<64, 1>` | 1 | 300.0 | 300.0 | 39.0% |' <<<"$out" || fail "TcForward row"
grep -qxF '| `RoundOperands<64>` | 0.5 | 20.0 | 40.0 | 2.6% |' <<<"$out" || fail "RoundOperands row"
[[ $(sed -n 3p <<<"$out") == *nvjet* ]] || fail "largest total first"
grep -qxF '| all | 2 | 770.0 | | |' <<<"$out" || fail "total row"
set +e
"$py" "$here/ncu_table.py" "$here/ncu_table_test.sh" >/dev/null 2>&1
rc=$?
set -e
[[ $rc == 2 ]] || fail "a file without ncu's header: exit $rc, not 2"
echo "ncu_table_test: ok"
