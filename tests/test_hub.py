"""reflex_runtime.modelfile.hub against a fake Hub on loopback.

The fake answers what huggingface_hub asks for (read off its source): the tree listing API
(`GET /api/models/{repo}/tree/{rev}`), model info, and `HEAD`/`GET /{repo}/resolve/{rev}/{file}`
with X-Repo-Commit and ETag; LFS files (the GGUFs) answer the HEAD with a 302 to a "CDN" on
another loopback address carrying X-Linked-Etag / X-Linked-Size, as the real Hub does.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

import pytest

from reflex_runtime.modelfile import hub
from reflex_runtime.errors import HubError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
COMMIT_V1 = "89abcdef0123456789abcdef0123456789abcdef"

REPOS = {
    ("acme/tiny-GGUF", "main"): {
        "tiny-Q8_0.gguf": b"GGUF" + b"\x08" * 1000,
        "tiny-Q4_K_M.gguf": b"GGUF" + b"\x04" * 600,
        "tiny-Q4_K_S.gguf": b"GGUF" + b"\x05" * 500,
        "mmproj-tiny-Q8_0.gguf": b"GGUF" + b"\x09" * 100,
        "extra/tiny-Q4_K_S.gguf": b"GGUF" + b"\x06" * 500,
        "big/tiny-Q2_K-00001-of-00002.gguf": b"GGUF" + b"\x02" * 10,
        "big/tiny-Q2_K-00002-of-00002.gguf": b"\x02" * 10,
        "README.md": b"# tiny\n",
    },
    ("acme/tiny-GGUF", "v1"): {"tiny-Q8_0.gguf": b"GGUF" + b"\x01" * 900},
}
COMMITS = {"main": COMMIT, "v1": COMMIT_V1}
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _git_oid(b: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest()


class FakeHub(BaseHTTPRequestHandler):
    cdn = ""  # base URL of the "CDN" server, set by the fixture
    log: list = []  # (method, path) of every request

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, ctype="application/json"):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, extra: dict | None = None):
        self._send(status, json.dumps({"error": code}).encode(), {"X-Error-Code": code, **(extra or {})})

    def _repo(self, repo: str, rev: str):
        if not any(r == repo for r, _ in REPOS):
            self._error(404, "RepoNotFound")
            return None
        files = REPOS.get((repo, rev))
        if files is None:
            self._error(404, "RevisionNotFound")
        return files

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urlparse(self.path)
        path = unquote(url.path)
        FakeHub.log.append((self.command, path))
        if path.startswith("/cdn/"):
            blob = next((b for files in REPOS.values() for b in files.values() if _sha256(b) == path[5:]), None)
            return self._send(200, blob, ctype="application/octet-stream") if blob is not None else self._send(404)
        if m := _TREE.match(path):
            files = self._repo(m["repo"], m["rev"])
            if files is None:
                return None
            listing = []
            for name, b in files.items():
                entry = {"type": "file", "oid": _git_oid(b), "size": len(b), "path": name}
                if name.endswith(".gguf"):
                    entry["lfs"] = {"oid": _sha256(b), "size": len(b), "pointerSize": 134}
                listing.append(entry)
            dirs = sorted({n.rsplit("/", 1)[0] for n in files if "/" in n})
            listing += [{"type": "directory", "oid": _git_oid(d.encode()), "size": 0, "path": d} for d in dirs]
            return self._send(200, json.dumps(listing).encode())
        if m := _INFO.match(path):
            rev = m["rev"] or "main"
            files = self._repo(m["repo"], rev)
            if files is None:
                return None
            info = {"id": m["repo"], "modelId": m["repo"], "sha": COMMITS[rev], "private": False,
                    "siblings": [{"rfilename": n} for n in files]}
            return self._send(200, json.dumps(info).encode())
        if m := _RESOLVE.match(path):
            files = self._repo(m["repo"], m["rev"])
            if files is None:
                return None
            commit = {"X-Repo-Commit": COMMITS[m["rev"]]}
            blob = files.get(m["path"])
            if blob is None:
                return self._error(404, "EntryNotFound", commit)
            if m["path"].endswith(".gguf"):  # LFS: metadata on the redirect, bytes from the CDN
                return self._send(302, b"", {**commit, "Location": f"{self.cdn}/cdn/{_sha256(blob)}",
                                             "X-Linked-Etag": f'"{_sha256(blob)}"', "X-Linked-Size": str(len(blob)),
                                             "ETag": f'"{_git_oid(blob)}"'})
            return self._send(200, blob, {**commit, "ETag": f'"{_git_oid(blob)}"'}, ctype="text/plain")
        return self._send(404, b'{"error": "not found"}')


def _serve(host: str) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer((host, 0), FakeHub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def fake_hub():
    api = _serve("127.0.0.1")
    try:
        cdn = _serve("127.0.0.2")  # another host, so huggingface_hub treats it as a CDN
    except OSError:
        cdn = api
    FakeHub.cdn = f"http://{cdn.server_address[0]}:{cdn.server_address[1]}"
    yield f"http://127.0.0.1:{api.server_address[1]}"
    for s in {api, cdn}:
        s.shutdown()
        s.server_close()


@pytest.fixture
def env(fake_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub)
    monkeypatch.setenv("REFLEX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    FakeHub.log = []
    return tmp_path


def _cdn_gets() -> int:
    return sum(1 for m, p in FakeHub.log if m == "GET" and p.startswith("/cdn/"))


def test_quant_tag_picks_the_single_file(env):
    path = hub.resolve_model_ref("acme/tiny-GGUF:q8_0")
    assert open(path, "rb").read() == REPOS[("acme/tiny-GGUF", "main")]["tiny-Q8_0.gguf"]
    assert path.startswith(str(env / "cache" / "hf")) and path.endswith("tiny-Q8_0.gguf")
    assert _cdn_gets() == 1
    assert ("GET", "/api/models/acme/tiny-GGUF/tree/main") in FakeHub.log
    # A second resolve finds the blob in the cache: metadata only, no new download.
    assert hub.resolve_model_ref("acme/tiny-GGUF:Q8_0") == path
    assert _cdn_gets() == 1


def test_exact_file_in_a_folder_and_revision(env):
    path = hub.resolve_model_ref("acme/tiny-GGUF:extra/tiny-Q4_K_S.gguf")
    assert open(path, "rb").read() == REPOS[("acme/tiny-GGUF", "main")]["extra/tiny-Q4_K_S.gguf"]
    v1 = hub.resolve_model_ref("acme/tiny-GGUF@v1:Q8_0")
    assert COMMIT_V1 in v1 and open(v1, "rb").read() == REPOS[("acme/tiny-GGUF", "v1")]["tiny-Q8_0.gguf"]


def test_offline_uses_the_cache_and_sends_nothing(env, monkeypatch):
    path = hub.resolve_model_ref("acme/tiny-GGUF:Q4_K_M")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    FakeHub.log = []
    assert hub.resolve_model_ref("acme/tiny-GGUF:Q4_K_M") == path
    assert hub.resolve_model_ref("acme/tiny-GGUF:tiny-Q4_K_M.gguf") == path
    assert FakeHub.log == []
    with pytest.raises(HubError, match="HF_HUB_OFFLINE=1") as e:
        hub.resolve_model_ref("acme/tiny-GGUF:tiny-Q8_0.gguf")
    assert "\n" not in str(e.value)
    with pytest.raises(HubError, match="not in the cache"):
        hub.resolve_model_ref("acme/other-GGUF:Q8_0")
    assert FakeHub.log == []


@pytest.mark.parametrize("ref, pattern", [
    ("acme/missing:Q8_0", r"repository acme/missing not found"),
    ("acme/missing:model.gguf", r"repository acme/missing not found"),
    ("acme/tiny-GGUF:nope-Q8_0.gguf", r"file 'nope-Q8_0.gguf' not found in acme/tiny-GGUF"),
    ("acme/tiny-GGUF@v9:Q8_0", r"revision 'v9' not found"),
    ("acme/tiny-GGUF:Q4_K_S", r"2 GGUF files match quant tag Q4_K_S: extra/tiny-Q4_K_S.gguf, tiny-Q4_K_S.gguf"),
    ("acme/tiny-GGUF:Q5_K_M", r"no GGUF file matching quant tag Q5_K_M; its GGUF files: .*tiny-Q8_0.gguf"),
    ("acme/tiny-GGUF:Q2_K", r"only split GGUF files match"),
    ("acme/tiny-GGUF", r"GGUF files match no quant tag"),
    ("not a ref", r"is not a model reference"),
    ("acme/tiny-GGUF:bad/tag", r"neither a .gguf file name nor a quant tag"),
])
def test_errors_are_one_line(env, ref, pattern):
    with pytest.raises(HubError, match=pattern) as e:
        hub.resolve_model_ref(ref)
    assert "\n" not in str(e.value)


def test_network_failure(env, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    import huggingface_hub.utils._http as hf_http

    monkeypatch.setattr(hf_http.time, "sleep", lambda s: None)  # skip the client's retry back-off
    for ref in ("acme/tiny-GGUF:Q8_0", "acme/tiny-GGUF:tiny-Q8_0.gguf"):
        with pytest.raises(HubError, match=rf"cannot (reach|download).*127\.0\.0\.1:{port}") as e:
            hub.resolve_model_ref(ref)
        assert "\n" not in str(e.value)


def test_cache_falls_back_to_hf_home(fake_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_hub)
    monkeypatch.delenv("REFLEX_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    path = hub.resolve_model_ref("acme/tiny-GGUF:Q4_K_M")
    assert path.startswith(str(tmp_path / "hfhome" / "hub" / "models--acme--tiny-GGUF"))


def test_pull_command_prints_the_path(env, capsys):
    from reflex_runtime.cli import main

    assert main(["pull", "acme/tiny-GGUF:Q4_K_M"]) == 0
    out, err = capsys.readouterr()
    path = out.strip()
    assert path.endswith("tiny-Q4_K_M.gguf") and open(path, "rb").read(4) == b"GGUF"
    assert main(["pull", "acme/missing:Q8_0"]) == HubError.exit_code
    assert "reflex: error: repository acme/missing not found" in capsys.readouterr().err


# -- unreachable Hub: immediate failure, or the cache --------------------------------------------


def _dead_endpoint() -> str:
    import socket

    with socket.socket() as s:  # a port nobody listens on: connect is refused at once
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("ref", ["acme/tiny-GGUF:Q8_0", "acme/tiny-GGUF:tiny-Q8_0.gguf", "acme/tiny-GGUF"])
def test_unreachable_hub_fails_at_once(env, monkeypatch, ref):
    """huggingface_hub alone retries a refused connection with backoff for ~23 s."""
    import time

    monkeypatch.setenv("HF_ENDPOINT", _dead_endpoint())
    t0 = time.monotonic()
    with pytest.raises(HubError, match="cannot reach .* and acme/tiny-GGUF.* is not in the cache") as e:
        hub.resolve_model_ref(ref)
    assert time.monotonic() - t0 < 2.0 and "\n" not in str(e.value)


def test_unreachable_hub_answers_from_the_cache(env, monkeypatch):
    path = hub.resolve_model_ref("acme/tiny-GGUF:Q4_K_M")
    monkeypatch.setenv("HF_ENDPOINT", _dead_endpoint())
    assert hub.resolve_model_ref("acme/tiny-GGUF:Q4_K_M") == path
    assert hub.resolve_model_ref("acme/tiny-GGUF:tiny-Q4_K_M.gguf") == path


def test_unresolvable_host_and_proxy_are_probed(monkeypatch):
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    assert "hub.invalid" in hub.unreachable("https://hub.invalid")  # RFC 2606: never resolves
    dead = _dead_endpoint()
    monkeypatch.setenv("https_proxy", dead)  # the probe goes to the proxy, as the client would
    assert dead.rsplit(":", 1)[1] in hub.unreachable("https://huggingface.co")
