#!/usr/bin/env bash
# Builds .whl/ here, on a machine that reaches the package index, for scripts/tools/device_check.sh on the GPU
# machine, which reaches nothing: the packages its image lacks that this project needs there, at the versions
# of the environment this runs in (or the newest, where it lacks one).
#
# The image (see the device tool's KINDS.md) has python3 3.12 with torch, numpy, numba, pytest, pyyaml,
# msgpack, protobuf, grpcio, aiohttp, click, filelock, requests, attrs, pandas and pyarrow; it lacks
# gymnasium, ale-py and ray, and ray's jsonschema. Ray's wheel (about 79 MB) is over the 64 MiB a device call
# carries, so it travels as a tar.xz of the wheel's files (about 31 MB) without the parts this project never
# imports: ray/jars (Java workers), ray/rllib, ray/serve, ray/llm. device_check.sh unpacks it into its
# --target folder beside the wheels. The whole of .whl/ is about 34 MB; .gitignore keeps it out of git.
#
# Usage: bash scripts/tools/device_wheels.sh [PYTHON_VERSION]   (default 3.12, the image's; 3.11 for a rehearsal
#        on this machine, in a venv with only the image's packages: see docs/atari-and-gpus.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER=${1:-3.12}
PY=${PYTHON:-python3}
TAG="cp${PYVER/./}"
OUT_DIR=.whl
PLAIN="gymnasium farama-notifications ale-py jsonschema jsonschema-specifications referencing rpds-py"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

pinned() {  # NAME -> NAME==VERSION of this environment, or NAME where it lacks the package
  local v
  v=$($PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null) \
    && echo "$1==$v" || echo "$1"
}

download() {  # SPEC DIR: one binary wheel for the image's Python and platform, without its dependencies
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${PLATFORMS[@]}" -d "$2" "$1"
}

rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
for name in $PLAIN; do
  download "$(pinned "$name")" "$OUT_DIR"
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
download "$(pinned ray)" "$tmp"
wheel=$(ls "$tmp"/ray-*.whl)
mkdir "$tmp/files"
# unpacked with each file's mode from the zip (ray's raylet and gcs_server must stay executable), as unzip does
$PY - "$wheel" "$tmp/files" <<'PYEOF'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        mode = info.external_attr >> 16
        if mode and not info.is_dir():
            os.chmod(path, mode & 0o777)
PYEOF
slim="$OUT_DIR/$(basename "$wheel" .whl)-slim.tar.xz"
tar -C "$tmp/files" --exclude=ray/jars --exclude=ray/rllib --exclude=ray/serve --exclude=ray/llm -cf - . \
  | xz -T0 -6 >"$slim"

ls -l "$OUT_DIR"
total=$(du -sm "$OUT_DIR" | cut -f1)
echo "$OUT_DIR: ${total} MiB for Python $PYVER ($TAG); a device call carries at most 64 MiB with the working tree"
