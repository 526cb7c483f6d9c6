#!/usr/bin/env bash
# scripts/gpu/gpu-lib.sh — sourced by scripts/gpu/gpu-real.sh and scripts/gpu/gpu-scale.sh, which carry their inputs to the device
# machine in parts (one call carries ≤ 64 MiB): the environment both run in, the parts' size check and staging, and a
# target package's GGUF (the chat target's is 94 MiB) split into two halves that travel in two calls and are put back
# together on the device where polyspec finds them (the package's layout rebuilt in $SITE).
MIB=$((1024 * 1024))

# device_env: reads REPO, SITE, STAGE, DEVICE. PY (this checkout's .venv, else python3) unless set; offline,
# unbuffered; $SITE (the carried wheels) first on PYTHONPATH. DEVICE=cpu is the rehearsal: no GPU, the device image's
# missing packages hidden, a polyspec cache of its own under $STAGE.
device_env() {
  if [ -z "${PY:-}" ]; then if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=$(command -v python3); fi; fi
  export HF_HUB_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
  if [ "$DEVICE" = cpu ]; then
    export CUDA_VISIBLE_DEVICES="" PYTHONPATH="$REPO/scripts/gpu/device_image:$PYTHONPATH"
    export POLYSPEC_CACHE=${POLYSPEC_CACHE:-$STAGE/cache}
  fi
}

# parts_fit PACK N…: each part's size; fails for one over 60 MiB (the rest of the call's 64 MiB is the working tree)
parts_fit() {
  local pack=$1 n size
  shift
  for n in "$@"; do
    size=$(du -sb "$pack/$n" | cut -f1)
    echo "$pack/$n: $((size / MIB)) MiB"
    ((size <= 60 * MIB)) || { echo "$pack/$n is over 60 MiB: it would not travel"; return 1; }
  done
}

# stage_part PACK STAGE N: part N, carried into the checkout (which each call replaces), copied to STAGE/N (which a
# warm machine keeps); the carried wheels ($WHEELS, with part 1) into $SITE unless installed (scripts/gpu/gpu-site.sh)
stage_part() {
  local pack=$1 stage=$2 n=$3
  [ -d "$pack/$n" ] || { echo "$pack/$n did not travel: carry $(basename "$pack")/$n"; return 1; }
  mkdir -p "$stage/$n" && cp -r "$pack/$n/." "$stage/$n/"
  PY=$PY WHEELS=$WHEELS SITE=$SITE bash "$REPO/scripts/gpu/gpu-site.sh"
}

# gguf_pack PY PACKAGE DEST1 DEST2: the first half into DEST1, the second with its sha256 and the package's
# dist-info (polyspec reads it to find the GGUF) into DEST2
gguf_pack() {
  local py=$1 package=$2 d1=$3 d2=$4 gguf dist half
  local where='import importlib.metadata as md, sys; d = md.distribution(sys.argv[1]); f = [d.locate_file(p) for p in d.files]
print(next(p for p in f if str(p).endswith(".gguf")), next(p for p in f if str(p).endswith(".dist-info/METADATA")).parent)'
  read -r gguf dist < <("$py" -c "$where" "$package")
  mkdir -p "$d1" "$d2"
  half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
  head -c "$half" "$gguf" >"$d1/gguf.part1"
  tail -c +$((half + 1)) "$gguf" >"$d2/gguf.part2"
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") >"$d2/gguf.sha256"
  cp -r "$dist" "$d2/"
}

# gguf_assemble PY S1 S2 SITE MODULE TARGET: the halves staged in S1 and S2 joined into SITE/MODULE/, checked
# against the recorded sha256, the dist-info beside; fails unless polyspec then finds that copy of TARGET's GGUF
gguf_assemble() {
  local py=$1 s1=$2 s2=$3 site=$4 module=$5 target=$6 name found
  mkdir -p "$site/$module"
  name=$(cut -d' ' -f3 <"$s2/gguf.sha256")
  cat "$s1/gguf.part1" "$s2/gguf.part2" >"$site/$module/$name"
  (cd "$site/$module" && sha256sum -c "$s2/gguf.sha256") || return 1
  cp -r "$s2"/*.dist-info "$site/"
  found=$("$py" -c "from polyspec.gguf_cache import locate_gguf; from polyspec.target_registry import resolve_target
print(locate_gguf(resolve_target('$target')))")
  case "$found" in "$site"/*) echo "the target's GGUF: $found" ;; *) echo "polyspec finds $found, not $site's"; return 1 ;; esac
}
