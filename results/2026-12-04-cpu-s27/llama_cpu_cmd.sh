# s27 (no GPU lent): llama.cpp's decode against its own prompt path and the numpy reference, on a CPU build of
# the pinned llama-cpp-python sdist's llama.cpp (the source the GPU peers are built from), for the converter-made
# fixtures and the full-size Qwen3.5-0.8B shape. ~25 min to build llama-server on 2 cores, ~3 min to run. From
# the repository root:
#   bash results/2026-12-04-cpu-s27/llama_cpu_cmd.sh [OUT_DIR]
set -e
OUT=${1:-results/2026-12-04-cpu-s27}
SRC=/tmp/s27/llama_cpp_python-0.3.36/vendor/llama.cpp
if [ ! -x $SRC/build/bin/llama-server ]; then
  python3 scripts/llama_cpp_sdist.py >/dev/null  # the pinned sdist into ~/.cache/reflex-runtime/test
  mkdir -p /tmp/s27 && tar xzf ~/.cache/reflex-runtime/test/llama_cpp_python-0.3.36.tar.gz -C /tmp/s27 \
    llama_cpp_python-0.3.36/vendor/llama.cpp
  (cd $SRC && cmake -B build -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
    && cmake --build build --target llama-server -j2) > /tmp/s27/build.log 2>&1
fi
for spec in qwen35:q8_0 qwen35:q4_k_m qwen35moe:q8_0 qwen3:q8_0; do
  f=$(PYTHONPATH=$PWD:$PWD/scripts python3 -c "from fixtures import make_fixture; print(make_fixture('${spec%%:*}', '${spec#*:}').gguf)")
  PYTHONPATH=$PWD python3 scripts/reference_vs_llama.py "$f" --llama-server $SRC/build/bin/llama-server --prompt-path \
    > "$OUT/llama-cpu-${spec/:/-}.txt" 2>&1
  tail -1 "$OUT/llama-cpu-${spec/:/-}.txt"
done
# the full-size Qwen3.5-0.8B shape (random weights, the GPU runs' maker; 0.8 GB), and how far the reference moves
# on it and on the fixture when its products' inputs are rounded to 8 bits as llama.cpp rounds them
python3 scripts/make_qwen35_bench.py --model 0.8b --type q8_0 --out /tmp/s27/q35/qwen35-0.8b-q8_0.gguf > /dev/null
PYTHONPATH=$PWD python3 scripts/reference_vs_llama.py /tmp/s27/q35/qwen35-0.8b-q8_0.gguf \
  --llama-server $SRC/build/bin/llama-server --prompt-path > "$OUT/llama-cpu-qwen35-0.8b-q8_0.txt" 2>&1
tail -1 "$OUT/llama-cpu-qwen35-0.8b-q8_0.txt"
PYTHONPATH=$PWD python3 scripts/reference_vs_llama.py /tmp/s27/q35/qwen35-0.8b-q8_0.gguf \
  --llama-server $SRC/build/bin/llama-server --activations8 > "$OUT/llama-cpu-qwen35-0.8b-q8_0-act8.txt" 2>&1
tail -1 "$OUT/llama-cpu-qwen35-0.8b-q8_0-act8.txt"
PYTHONPATH=$PWD python3 results/2026-12-04-cpu-s27/reference_sensitivity.py /tmp/s27/q35/qwen35-0.8b-q8_0.gguf \
  > "$OUT/reference-sensitivity-qwen35-0.8b-q8_0.txt" 2>&1
q8=$(PYTHONPATH=$PWD:$PWD/scripts python3 -c "from fixtures import make_fixture; print(make_fixture('qwen35', 'q8_0').gguf)")
PYTHONPATH=$PWD python3 results/2026-12-04-cpu-s27/reference_sensitivity.py "$q8" "$(dirname "$q8")/f32-$(basename "$q8" | cut -d- -f2)" \
  > "$OUT/reference-sensitivity-qwen35-q8_0.txt" 2>&1
tail -qn 1 "$OUT"/reference-sensitivity-*.txt
