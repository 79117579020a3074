#!/usr/bin/env bash
# Install the Transformers.js that tests/test_export_clients.py loads exports with.
#
#   .ci/js_env.sh DIR          (needs node and npm on PATH)
#
# DIR/node_modules/@huggingface/transformers at the pinned version, from the npm registry
# (~470 MB with onnxruntime-node and -web). ONNXRUNTIME_NODE_INSTALL=skip: onnxruntime-node
# ships its CPU binary in the package; its install script would only fetch GPU extras.
#
# Idempotent: DIR/COMPLETE records the pins of a finished install; a rerun with the same
# pins does nothing. An install goes to DIR.tmp-PID and is renamed to DIR only when complete.
set -euo pipefail

DIR="${1:?usage: .ci/js_env.sh DIR}"
PINS="@huggingface/transformers@4.3.1"
NODE_PINS="$PINS node=$(node --version)"

if [ -f "$DIR/COMPLETE" ] && [ "$(cat "$DIR/COMPLETE")" = "$NODE_PINS" ]; then
    echo "js env up to date: $DIR"
    exit 0
fi

TMP="$DIR.tmp-$$"
trap 'rm -rf "$TMP"' EXIT
rm -rf "$TMP"
mkdir -p "$TMP"
(cd "$TMP" && echo '{"private": true}' >package.json &&
    ONNXRUNTIME_NODE_INSTALL=skip npm install --no-audit --no-fund --loglevel=error $PINS </dev/null)
echo "$NODE_PINS" >"$TMP/COMPLETE"

rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
mv "$TMP" "$DIR"
trap - EXIT
echo "js env built: $DIR"
