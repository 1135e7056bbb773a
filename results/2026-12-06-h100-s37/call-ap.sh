# s37: s36's call A (the tensor-core attention's GPU tests, decode by depth for the tile kernels / TC from 1,024 keys /
# TC everywhere, and 42e62c9's TC loop) then P (ncu on reflex_attn_decode_t2 at 16,384 keys), in one call so that one
# machine start pays for both. Everything lands in $OUT/all.tar.gz (the tool brings back at most 8 files).
W=$OUT/w; mkdir -p $W
NEXT=A OUT=$W bash results/2026-12-05-s36/next-calls.sh 2>&1 | tee $W/a.log | tail -14
mkdir -p $W/p; NEXT=P OUT=$W/p bash results/2026-12-05-s36/next-calls.sh 2>&1 | tee $W/p.log | tail -10
tar -C $OUT -czf $OUT/all.tar.gz w && rm -rf $W
