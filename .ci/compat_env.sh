#!/usr/bin/env bash
# Build the OLD sentence-transformers stacks that tests/test_export_compat.py loads exports in.
#
#   .ci/compat_env.sh DIR            (PYTHON=path/to/python to pick the interpreter)
#
# Users deploy exports on older stacks than ours (sentence-transformers 6 + transformers 5),
# so the test loads a fresh export with each of these, in a separate process:
#
#   DIR/st5   sentence-transformers 5.1.2   (the version of the user report, issue 14)
#   DIR/st4   sentence-transformers 4.1.0
#   DIR/st3   sentence-transformers 3.4.1
#   DIR/common  transformers 4.57.6 and the few packages whose allowed versions differ from
#               the main environment's (tokenizers, huggingface-hub 0.x and its requests)
#   DIR/onnx    sentence-transformers' ONNX backend for that stack (optimum-onnx 0.1.0, which
#               supports only transformers < 4.58, so it cannot run in the main environment)
#               and accelerate 1.10: with DIR/st5 this loads `simcse-kit export --onnx` folders
#               (written in the main environment) with backend="onnx"
#   DIR/base    symlinks to the main environment's site-packages MINUS the Hugging Face stack
#               (transformers, sentence-transformers, tokenizers, huggingface-hub, datasets,
#               accelerate, optimum, peft, ...): torch, numpy, scipy, scikit-learn, safetensors, ...
#               (peft: transformers 4.57's Trainer imports it when present, and the main
#               environment's peft needs accelerate, which this stack leaves out)
#
# Run a loader as `python -S` (no site-packages) with PYTHONPATH=DIR/st5:DIR/common:DIR/base,
# using the main environment's python: torch is never downloaded again, and no package of the
# new stack leaks in. Leaving out datasets and accelerate is also what a deployment looks like
# (`pip install sentence-transformers` installs neither) and it has to be: the main
# environment's datasets needs huggingface-hub 2.x. Each download is --no-deps at an exact
# version, so the result does not drift with PyPI. PyPI only, no stdin; ~60 MB to download.
#
# Idempotent: DIR/COMPLETE records the pins of a finished build; a rerun with the same pins
# downloads nothing and only refreshes DIR/base (the main environment may have changed). A
# build goes to DIR.tmp-PID and is renamed to DIR only when complete.
set -euo pipefail

DIR="${1:?usage: .ci/compat_env.sh DIR}"
PYTHON="${PYTHON:-python3}"

COMMON=(
    "transformers==4.57.6"
    "tokenizers==0.22.1"
    "huggingface-hub==0.36.0"
    "requests==2.32.5"
    "urllib3==2.5.0"
    "certifi==2025.10.5"
    "charset-normalizer==3.4.4"
)
ONNX=(
    "optimum==2.1.0"
    "optimum-onnx==0.1.0"
    "onnx==1.23.2"
    "onnxruntime==1.32.0"
    "protobuf==6.33.0"
    "ml_dtypes==0.5.4"
    "flatbuffers==25.9.23"
    "accelerate==1.10.1"
)
ST5="sentence-transformers==5.1.2"
ST4="sentence-transformers==4.1.0"
ST3="sentence-transformers==3.4.1"
PINS="${COMMON[*]} ${ONNX[*]} $ST5 $ST4 $ST3 python=$("$PYTHON" -c 'import sys; print(sys.version_info[:2])')"

# The main environment minus the Hugging Face stack, as symlinks (rebuilt on every call).
link_base() {
    local site base="$1/base" entry name
    site="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    rm -rf "$base"
    mkdir -p "$base"
    for entry in "$site"/*; do
        name="$(basename "$entry")"
        # Lower-cased, "-" as "_": covers both the package and its NAME-VERSION.dist-info.
        case "$(echo "$name" | tr 'A-Z-' 'a-z_')" in
            transformers | transformers_* | sentence_transformers | sentence_transformers_* | \
                tokenizers | tokenizers_* | huggingface_hub | huggingface_hub_* | hf_xet | hf_xet_* | \
                datasets | datasets_* | accelerate | accelerate_* | optimum* | onnx* | \
                peft | peft_* | simcse_kit* | __editable__* | *.pth | __pycache__) continue ;;
        esac
        ln -s "$entry" "$base/$name"
    done
}

if [ -f "$DIR/COMPLETE" ] && [ "$(cat "$DIR/COMPLETE")" = "$PINS" ]; then
    link_base "$DIR"
    echo "compat env up to date: $DIR"
    exit 0
fi

TMP="$DIR.tmp-$$"
trap 'rm -rf "$TMP"' EXIT
rm -rf "$TMP"
mkdir -p "$TMP"
pip_target() {
    "$PYTHON" -m pip install --quiet --no-input --disable-pip-version-check --no-deps \
        --only-binary=:all: --target "$TMP/$1" "${@:2}"
}
pip_target common "${COMMON[@]}"
pip_target onnx "${ONNX[@]}"
pip_target st5 "$ST5"
pip_target st4 "$ST4"
pip_target st3 "$ST3"
link_base "$TMP"
echo "$PINS" >"$TMP/COMPLETE"

rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
mv "$TMP" "$DIR"
trap - EXIT
echo "compat env built: $DIR"
