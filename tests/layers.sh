#!/bin/bash
# The layers of doc/architecture.md, checked on this build's objects: no two
# objects of src/ or transports/ call each other (directly or round a
# circle), and none calls into a layer above its own
# (scripts/check-layers.py reads their symbols with nm).
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
B=${FR_BUILDDIR:-$src}
command -v nm >/dev/null || { echo "SKIP: nm not found (binutils)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
python3 "$src/scripts/check-layers.py" --all "$B"
