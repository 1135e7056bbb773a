#!/usr/bin/env bash
# The whole local Lambda path on a machine with no image registry: start Docker, make a base
# image without pulling (scripts/make_local_base.sh), build the function image with the embedded
# Gemma 3 270M baked in, and `sam local invoke` every sample event in events/, with every AWS
# endpoint pinned to loopback. Without a GPU the runtime falls back to the CPU reference.
#
#   scripts/sam_local.sh [EVENT_NAME ...]      (default: every events/*.json)
#
# Exit codes: 0 all checks passed; 1 a check or step failed; 77 Docker cannot run here.
# Outputs (responses + logs per event) go to $REFLEX_SAM_OUT (default: a fresh temp dir).
# Cached across runs in ~/.cache/reflex-runtime/: the base rootfs tarball, the SAM venv; the
# Docker build cache lives in dockerd's own storage.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/reflex-runtime"
BASE_IMAGE="reflex-local-base:bookworm"
IMAGE="${REFLEX_SAM_IMAGE:-reflex-runtime:sam-local}"
OUT="${REFLEX_SAM_OUT:-$(mktemp -d /tmp/reflex-sam.XXXXXX)}"
SAM_VENV="$CACHE/sam-venv"
T_START=$SECONDS

log() { echo "sam_local: [$((SECONDS - T_START))s] $*" >&2; }
cannot_run() { log "docker cannot run here: $*"; exit 77; }
mkdir -p "$CACHE" "$OUT"

# -- Docker ---------------------------------------------------------------------------------
# Debian's client: its built-in BuildKit needs no buildx plugin (another docker may be first in PATH).
DOCKER=/usr/bin/docker
if ! [ -x "$DOCKER" ] || ! command -v dockerd >/dev/null; then
    [ "$(id -u)" = 0 ] || cannot_run "docker.io is not installed and installing it needs root"
    command -v apt-get >/dev/null || cannot_run "docker.io is not installed and there is no apt-get"
    log "installing docker.io"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
if ! "$DOCKER" info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || cannot_run "no Docker daemon is running and starting one needs root"
    log "starting dockerd (log: $CACHE/dockerd.log)"
    nohup dockerd >"$CACHE/dockerd.log" 2>&1 &
    for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
    "$DOCKER" info >/dev/null 2>&1 || cannot_run "dockerd did not come up: $(tail -3 "$CACHE/dockerd.log" | tr '\n' ' ')"
fi
export DOCKER_BUILDKIT=1 PATH="/usr/bin:$PATH"

# -- SAM CLI (its wheel ships the Runtime Interface Emulator: nothing is fetched at invoke) ---
if ! [ -x "$SAM_VENV/bin/sam" ]; then
    log "installing aws-sam-cli into $SAM_VENV"
    python3 -m venv "$SAM_VENV"
    "$SAM_VENV/bin/pip" install -q aws-sam-cli
fi

# -- images -------------------------------------------------------------------------------------
DOCKER="$DOCKER" bash "$ROOT/scripts/make_local_base.sh" "$BASE_IMAGE"
# A fatbin built at install time is packaged as is (no GPU here, so it is never loaded);
# without one the image is CPU-only.
KERNELS=none
[ -f "$ROOT/reflex_runtime/_kernels/reflex.fatbin" ] && KERNELS=prebuilt
log "building $IMAGE (KERNELS=$KERNELS, MODEL=embedded)"
"$DOCKER" build --network host -q -t "$IMAGE" \
    --build-arg BUILD_BASE="$BASE_IMAGE" --build-arg RUNTIME_BASE="$BASE_IMAGE" \
    --build-arg KERNELS="$KERNELS" --build-arg MODEL=embedded \
    "$ROOT" >"$OUT/docker-build.log" 2>&1 || { tail -30 "$OUT/docker-build.log" >&2; exit 1; }
"$DOCKER" image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB\n", $1 / 1e6}' >"$OUT/image-size.txt"
log "image size $(cat "$OUT/image-size.txt") (the baked model is ~253 MB of it)"

# -- invoke every event, nothing leaves loopback ------------------------------------------------
export AWS_DEFAULT_REGION=us-east-1 AWS_ACCESS_KEY_ID=dummy AWS_SECRET_ACCESS_KEY=dummy \
    SAM_CLI_TELEMETRY=0 AWS_ENDPOINT_URL=http://127.0.0.1:9 AWS_MAX_ATTEMPTS=1 AWS_EC2_METADATA_DISABLED=true
if [ $# -gt 0 ]; then EVENTS=("$@"); else EVENTS=(); for f in "$ROOT"/events/*.json; do EVENTS+=("$(basename "$f" .json)"); done; fi
for name in "${EVENTS[@]}"; do
    t0=$SECONDS
    "$SAM_VENV/bin/sam" local invoke ReflexFunction -t "$ROOT/template.yaml" -e "$ROOT/events/$name.json" \
        --skip-pull-image --parameter-overrides "ImageUri=$IMAGE" >"$OUT/$name.json" 2>"$OUT/$name.log" \
        || { tail -20 "$OUT/$name.log" >&2; log "sam local invoke $name failed"; exit 1; }
    log "invoked $name in $((SECONDS - t0))s"
done

# -- checks ---------------------------------------------------------------------------------------
python3 - "$OUT" "${EVENTS[@]}" <<'EOF'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
failures = []

def load(name):
    r = json.loads(open(f"{out}/{name}.json").read().strip().splitlines()[-1])
    if isinstance(r.get("body"), str):  # an HTTP response: decode a JSON body
        headers = r.get("headers") or {k: v[0] for k, v in (r.get("multiValueHeaders") or {}).items()}
        if headers.get("Content-Type") == "application/json":
            r["body"] = json.loads(r["body"])
    return r


def check(name, ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {what}")
    if not ok:
        failures.append(name)

expect_status = {"bad_request": 400, "furl_bad_json": 400}
for name in names:
    r = load(name)
    status = r.get("statusCode")
    check(name, status == expect_status.get(name, 200), f"status {status}")
    body = r.get("body", r)
    if name == "generate":
        check(name, "Paris" in body.get("text", ""), f"text {body.get('text')!r} contains 'Paris'")
    elif name == "system1":
        check(name, body.get("best_text") == " Paris", f"best {body.get('best_text')!r}")
    elif name == "bad_request":
        err = body.get("error", {})
        check(name, err.get("param") == "max_tokens" and err.get("type") == "invalid_request_error",
              f"error {err.get('message')!r} names {err.get('param')!r}")
    elif name == "furl_bad_json":
        check(name, "invalid JSON" in body.get("error", {}).get("message", ""), "invalid JSON named")
    elif name == "furl_chat_stream":
        check(name, isinstance(body, str) and body.endswith("data: [DONE]\n\n"), "one complete SSE body")
    logs = open(f"{out}/{name}.log").read()
    if name == "generate":
        check(name, "using the CPU reference backend" in logs, "the CPU fallback is logged")
        check(name, '"ProcessStartToFirstTokenMs"' in logs and '"cold_start":true' in logs, "cold-start log + EMF metric")
print(f"{len(names) - len(set(failures))} passed, {len(set(failures))} failed")
sys.exit(1 if failures else 0)
EOF
# Each rebuild leaves the previous image (and SAM's emulator layer over it) untagged: drop those.
"$DOCKER" image prune -f >/dev/null 2>&1 || true
log "done; outputs in $OUT"
