#!/usr/bin/env bash
# dashboards/pipetrain.json type-checks against @grafana/schema's Dashboard
# type (tools/grafana-schema-check/dashboard_types.ts, with each panel's
# plugin options) under tsc --noEmit, and a deliberately broken dashboard is
# rejected with the expected errors, so the check cannot pass vacuously.
# The dashboard's JSON text becomes an object literal assigned to a constant
# of that type: string enum values, required options (legend.calcs), field
# types and unknown fields are all checked, and tsc's line numbers are the
# JSON file's. Runs under Bazel (//tests:dashboard_schema_test) or directly:
#   tests/dashboard_schema_test.sh
set -u

if [ -n "${TEST_SRCDIR:-}" ]; then
  R="$TEST_SRCDIR/$TEST_WORKSPACE"
  T="$TEST_TMPDIR"
  # node_modules is not a Bazel input (installed by scripts/setup.sh): find
  # it next to the real package.json.
  CHECK_DIR="$(dirname "$(readlink -f "$R/tools/grafana-schema-check/package.json")")"
else
  R="$(cd "$(dirname "$0")/.." && pwd)"
  T="$(mktemp -d)"
  trap 'rm -rf "$T"' EXIT
  CHECK_DIR="$R/tools/grafana-schema-check"
fi
MODULES="$CHECK_DIR/node_modules"

missing=""
command -v node > /dev/null || missing="$missing node (Debian package nodejs)"
for package in @grafana/schema typescript; do
  [ -f "$MODULES/$package/package.json" ] || missing="$missing $MODULES/$package"
done
if [ -n "$missing" ]; then
  echo "FAIL: missing:$missing"
  echo "Run scripts/setup.sh (installs node, and runs npm ci in tools/grafana-schema-check)."
  exit 1
fi

source "$R/tests/check_lib.sh"  # check, fails, has, report

# Type-checks dashboard JSON file $1 (shown as $2 in messages); tsc's output
# goes to stdout with "dashboard.ts(L,C)" turned into "$2:L:C".
typecheck() {
  local json=$1 shown=$2 dir
  dir="$(mktemp -d "$T/check.XXXXXX")"
  cp "$R/tools/grafana-schema-check/dashboard_types.ts" "$dir/"
  {
    printf 'export const dashboard: CheckedDashboard = '
    cat "$json"
    printf ';\nimport type { CheckedDashboard } from "./dashboard_types";\n'
  } > "$dir/dashboard.ts"
  cat > "$dir/tsconfig.json" <<JSON
{
  "compilerOptions": {
    "strict": true, "noEmit": true, "skipLibCheck": true,
    "target": "es2020", "module": "commonjs", "moduleResolution": "node",
    "types": [], "baseUrl": ".",
    "paths": {"@grafana/schema": ["$MODULES/@grafana/schema"]}
  },
  "files": ["dashboard.ts"]
}
JSON
  (cd "$dir" && node "$MODULES/typescript/bin/tsc" -p tsconfig.json) > "$dir/tsc.txt" 2>&1
  local code=$?
  sed -E "s#^dashboard\\.ts\\(([0-9]+),([0-9]+)\\)#${shown}:\\1:\\2#" "$dir/tsc.txt"
  return $code
}

DASHBOARD=dashboards/pipetrain.json
check "$DASHBOARD type-checks against @grafana/schema" typecheck "$R/$DASHBOARD" "$DASHBOARD"
[ "$fail" -eq 0 ] && echo "$DASHBOARD: type-checks against @grafana/schema $(node -p "require('$MODULES/@grafana/schema/package.json').version") (tsc $(node -p "require('$MODULES/typescript/package.json').version"))"

# "All" of a variable listing instances must be the instances it lists, not
# any (allValue ".*"): the worker panels match `instance=~"$worker"`, and
# ".*" would take every worker Prometheus scrapes, a second install's too.
instance_variables_all() {
  node -e '
    const d = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    for (const v of d.templating.list) {
      const query = JSON.stringify(v.query || "");
      if (v.includeAll && /instance=~\\"\$coordinator\\"/.test(query) &&
          /metrics_address|instance\)/.test(query)) {
        console.log(`${v.name}: ${v.allValue === undefined ? "the listed values" : v.allValue}`);
      }
    }' "$1"
}
instance_variables_all "$R/$DASHBOARD" > "$T/all_values.txt"
check "the worker variable's All is the listed workers" \
  diff <(echo "worker: the listed values") "$T/all_values.txt"

# The broken dashboard: a legend without calcs, a height as a string, a
# legend display mode that does not exist.
BROKEN=tests/testdata/broken_dashboard.json
typecheck "$R/$BROKEN" "$BROKEN" > "$T/broken.txt"
code=$?
echo "broken dashboard (tsc exit $code):"; cat "$T/broken.txt"
check "broken dashboard fails" test "$code" -ne 0
check "broken dashboard: legend.calcs missing" has "$T/broken.txt" \
  "$BROKEN:14:9: error TS2741: Property 'calcs' is missing"
check "broken dashboard: gridPos.h a string" has "$T/broken.txt" \
  "$BROKEN:12:19: error TS2322: Type 'string' is not assignable to type 'number'."
check "broken dashboard: legend displayMode sidebar" has "$T/broken.txt" \
  "$BROKEN:25:33: error TS2322: Type '\"sidebar\"' is not assignable to type '\"list\" | \"hidden\" | \"table\"'."
check "broken dashboard: the valid fields are not reported" fails has "$T/broken.txt" "$BROKEN:5:"

report
