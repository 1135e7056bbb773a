"""The README's deploy snippet runs as written (issue 29): every variable it uses is defined in it,
and its curl line sends the API key to a Function URL that the snippet deployed with the auth
type that accepts one. The snippet runs under `bash -eu` with docker, aws, sam, openssl and curl
replaced by stubs that record their arguments: nothing reaches AWS."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCOUNT, URL, KEY = "123456789012", "https://abc123.lambda-url.us-east-1.on.aws/", "0f" * 16

STUBS = f"""
log() {{ "{sys.executable}" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$CALLS"; }}
aws() {{
  log aws "$@"
  case "$1 $2" in
    "sts get-caller-identity") echo {ACCOUNT} ;;
    "cloudformation describe-stacks") echo {URL} ;;
    "ecr get-login-password") echo password ;;
  esac
}}
docker() {{ log docker "$@"; cat > /dev/null; }}
sam() {{ log sam "$@"; }}
openssl() {{ log openssl "$@"; echo {KEY}; }}
curl() {{ log curl "$@"; }}
"""


def deploy_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Deploy\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def run_snippet(tmp_path) -> list[list[str]]:
    calls = tmp_path / "calls.jsonl"
    script = tmp_path / "deploy.sh"
    script.write_text("set -euo pipefail\n" + STUBS + deploy_snippet())
    # A clean environment: a variable the snippet does not define is an error under `set -u`.
    r = subprocess.run(["env", "-i", f"PATH={Path('/usr/bin')}:{Path('/bin')}", f"CALLS={calls}", "bash", str(script)],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in calls.read_text().splitlines()]


def _overrides(sam_args: list[str]) -> dict:
    i = sam_args.index("--parameter-overrides")
    return dict(a.split("=", 1) for a in sam_args[i + 1:] if "=" in a and not a.startswith("--"))


def test_every_variable_is_defined_and_the_curl_line_reaches_the_deployed_url(tmp_path):
    calls = run_snippet(tmp_path)
    (curl,) = [c[1:] for c in calls if c[0] == "curl"]
    assert curl[1] == URL + "v1/chat/completions"
    assert curl[curl.index("-H") + 1] == f"Authorization: Bearer {KEY}"
    body = json.loads(curl[curl.index("-d") + 1])
    assert body["messages"][0]["role"] == "user" and body["max_tokens"] == 32
    (push,) = [c for c in calls if c[:2] == ["docker", "push"]]
    assert push[2] == f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/reflex-runtime:latest"


def test_the_deploy_sets_the_auth_type_the_curl_line_needs(tmp_path):
    """The template's Function URL defaults to AWS_IAM (SigV4 only); a Bearer key needs NONE + ApiKey."""
    template = (ROOT / "template.yaml").read_text()
    (sam,) = [c[1:] for c in run_snippet(tmp_path) if c[0] == "sam"]
    over = _overrides(sam)
    assert over["FunctionUrlAuthType"] == "NONE" and over["ApiKey"] == KEY
    params = template.split("\nParameters:\n", 1)[1].split("\nResources:\n", 1)[0]
    for name in over:  # every override is a parameter the template declares
        assert re.search(rf"^  {name}:$", params, re.M), name
    assert re.search(r"FunctionUrlAuthType:\n(?:    .*\n)*?    AllowedValues: \[AWS_IAM, NONE\]", params)
    assert "REFLEX_API_KEY: !Ref ApiKey" in template and "AuthType: !Ref FunctionUrlAuthType" in template
    outputs = template.split("\nOutputs:\n", 1)[1]
    assert re.search(r"^  FunctionUrl:$", outputs, re.M)  # what the snippet's describe-stacks query reads
    assert "OutputKey=='FunctionUrl'" in " ".join(shlex.split(deploy_snippet(), comments=True))
