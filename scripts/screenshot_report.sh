#!/usr/bin/env bash
# Screenshot a report.html with headless Chromium (Debian's `chromium` package).
#   scripts/screenshot_report.sh RUN_DIR/report/report.html [out.png] [height]
# Without an argument, builds a synthetic report (tests/report_fixture.py) and shots that.
set -euo pipefail
cd "$(dirname "$0")/.."
html="${1:-}"
out="${2:-report_screenshot.png}"
height="${3:-2400}"
if [[ -z "$html" ]]; then
  tmp=$(mktemp -d)
  html=$(.venv/bin/python - "$tmp" <<'PY'
import sys
sys.path.insert(0, "tests")
from pathlib import Path
from report_fixture import make_run
from infrarsi.report import build_report
run = make_run(Path(sys.argv[1]), "promoted")
print(build_report(run.run_dir, bank_url=run.bank_url).html)
PY
)
fi
command -v chromium >/dev/null || { echo "chromium not found: apt-get install -y chromium" >&2; exit 2; }
profile=$(mktemp -d)
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars --screenshot="$out" \
  --window-size=1280,"$height" "file://$(realpath "$html")" 2>/dev/null
rm -rf "$profile"
echo "screenshot: $(realpath "$out") (of $html)"
