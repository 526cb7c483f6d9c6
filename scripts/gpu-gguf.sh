#!/usr/bin/env bash
# scripts/gpu-gguf.sh — sourced by scripts/gpu-real.sh and scripts/gpu-scale.sh: a target package's GGUF (the chat
# target's is 94 MiB, over one device call's 64 MiB) split into two halves that travel in two calls, and put back
# together on the device machine where polyspec finds it (the package's layout rebuilt in $SITE).

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
