#!/usr/bin/env bash
# Vendor the chat page's libraries (ollapy/web/vendor/) from npm at pinned versions, and record each package's
# version and npm integrity and each copied file's sha256 in ollapy/web/vendor/VERSIONS.
# Run by hand when a version changes (needs npm and the registry); the copied files are committed, so neither
# `pip install` nor the page needs Node or the network.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/ollapy/web/vendor"
# package@version  file-in-package  name-in-vendor
FILES=(
  "marked@18.3.0 package/lib/marked.esm.js marked.esm.js"
  "dompurify@3.5.0 package/dist/purify.es.mjs purify.es.mjs"
  "@highlightjs/cdn-assets@11.12.0 package/es/highlight.min.js highlight.min.js"
  "@highlightjs/cdn-assets@11.12.0 package/styles/github.min.css hljs-light.min.css"
  "@highlightjs/cdn-assets@11.12.0 package/styles/github-dark.min.css hljs-dark.min.css"
  "marked@18.3.0 package/LICENSE LICENSE.marked"
  "dompurify@3.5.0 package/LICENSE LICENSE.dompurify"
  "@highlightjs/cdn-assets@11.12.0 package/LICENSE LICENSE.highlightjs"
)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$DEST"
{
  echo "# ollapy/web/vendor: written by scripts/vendor_web.sh; do not edit by hand"
  echo "# package version npm-integrity"
} > "$WORK/VERSIONS"
declare -A DONE=()
for row in "${FILES[@]}"; do
  read -r spec member name <<<"$row"
  if [[ -z "${DONE[$spec]:-}" ]]; then
    mkdir -p "$WORK/$spec"
    (cd "$WORK/$spec" && npm pack --silent --json "$spec" > pack.json && tar xzf ./*.tgz)
    integrity="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["integrity"])' "$WORK/$spec/pack.json")"
    echo "package ${spec%@*} ${spec##*@} $integrity" >> "$WORK/VERSIONS"
    DONE[$spec]=1
  fi
  cp "$WORK/$spec/$member" "$DEST/$name"
done
echo "# sha256 file (from package@version:path)" >> "$WORK/VERSIONS"
for row in "${FILES[@]}"; do
  read -r spec member name <<<"$row"
  echo "sha256 $(sha256sum "$DEST/$name" | cut -d' ' -f1) $name ($spec:${member#package/})" >> "$WORK/VERSIONS"
done
cp "$WORK/VERSIONS" "$DEST/VERSIONS"
cat "$DEST/VERSIONS"
