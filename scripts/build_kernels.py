#!/usr/bin/env python3
"""Compile kernels/*.cu ahead of time into ONE fatbin plus a manifest of kernel names.

    python scripts/build_kernels.py [--out DIR] [--nvcc PATH] [--archs 90,100] [--jobs N] [--force]

Every .cu compiles on its own (it includes the .cuh headers it uses); the build compiles one
translation unit that includes them all, as whole-program device code, for each architecture
in two jobs: nvcc to PTX, then ptxas to SASS, every architecture's jobs in parallel (one per
core, a progress line as each ends). fatbinary packs the SASS of every architecture and the PTX
of the newest into reflex.fatbin, which the runtime loads with one cuModuleLoadData. (Relocatable
code per file, device-linked, gives other SASS: ptxas allocates registers differently in its
relocatable mode, up to 60% more on sm_75-sm_89; whole-program units keep today's code.)
Nothing is compiled at run time, ever.

Pieces are cached by a hash of the sources (every .cu and .cuh), the flags and the nvcc version,
in $REFLEX_KERNEL_CACHE (default $REFLEX_CACHE/kernels, else ~/.cache/reflex-runtime/kernels),
which a `pip install .` building in a temporary copy still finds: an unchanged tree re-installs
in seconds. Pieces unused for 30 days are removed.

Architectures: SASS for every one of WANTED_ARCHS the toolkit knows, or only those of --archs /
$REFLEX_ARCHS (e.g. 90 for an H100/H200: a quick build for one GPU). nvcc is found through
$NVCC, PATH, $CUDA_HOME, /usr/local/cuda, or the nvidia-cuda-nvcc wheels. The package's build
backend calls build_for_install(): without nvcc it warns once and the CPU reference serves;
REFLEX_SKIP_KERNELS=1 skips the build; REFLEX_REQUIRE_KERNELS=1 makes a failure fail the install.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

WANTED_ARCHS = (75, 80, 86, 89, 90, 100, 120)
FATBIN = "reflex.fatbin"
MANIFEST = "manifest.json"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC_FLAGS = ("-O3", "-std=c++17")
# What nvcc itself records for the PTX's JIT compile (nvcc --dryrun --fatbin shows it).
CICC_CMDLINE = "-ftz=0 -prec_div=1 -prec_sqrt=1 -fmad=1 "
CACHE_DAYS = 30
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def kernel_names(root: str = ROOT) -> list[str]:
    """Every kernel name the fatbin must carry: collected from the ops modules
    (reflex_runtime/gpu/ops/, one per kernel file), which import nothing outside the standard
    library and the package's light modules, so this works before anything is installed."""
    if root not in sys.path:
        sys.path.insert(0, root)
    from reflex_runtime.gpu.ops import kernel_names as collect

    return list(collect())


def find_nvcc() -> str | None:
    candidates = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", "nvcc"))
    purelib = sysconfig.get_paths()["purelib"]
    candidates += sorted(glob.glob(os.path.join(purelib, "nvidia", "cu*", "bin", "nvcc")))
    candidates += sorted(glob.glob(os.path.join(purelib, "nvidia", "cuda_nvcc", "bin", "nvcc")))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def toolkit_tool(nvcc: str, name: str) -> str:
    """ptxas / fatbinary of the toolkit this nvcc belongs to (nvcc may be a wrapper script)."""
    out = subprocess.run([nvcc, "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True, text=True).stderr
    m = re.search(r"^#\$ TOP=(.*)$", out, re.M)
    dirs = ([os.path.join(m.group(1).strip(), "bin")] if m else []) + [os.path.dirname(nvcc),
                                                                       os.path.dirname(os.path.realpath(nvcc))]
    for d in dirs:
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found beside {nvcc}")
    return found


def supported_archs(nvcc: str) -> list[int]:
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
        have = {int(a.split("_")[1]) for a in out.split() if a.startswith("compute_")}
    except (subprocess.CalledProcessError, ValueError):
        have = {75, 80, 86, 89, 90}  # old nvcc without --list-gpu-arch
    return [a for a in WANTED_ARCHS if a in have]


def requested_archs(spec: str | None) -> list[int] | None:
    """--archs or $REFLEX_ARCHS ("90", "80,90", "sm_90"): None means every supported one."""
    spec = spec if spec is not None else os.environ.get("REFLEX_ARCHS")
    if not spec or not spec.strip():
        return None
    try:
        return [int(a.strip().removeprefix("sm_")) for a in spec.split(",") if a.strip()]
    except ValueError:
        raise SystemExit(f"build_kernels: architectures are numbers like 90 or 80,90, not {spec!r}") from None


def kernel_sources(root: str = ROOT) -> list[str]:
    return sorted(glob.glob(os.path.join(root, "kernels", "*.cu")))


def headers_of(path: str) -> list[str]:
    """The kernels/ headers a source includes, directly or through other headers."""
    seen, todo = [], [path]
    while todo:
        with open(todo.pop(), encoding="utf-8") as f:
            text = f.read()
        for name in _INCLUDE.findall(text):
            dep = os.path.join(os.path.dirname(path), name)
            if os.path.isfile(dep) and dep not in seen:
                seen.append(dep)
                todo.append(dep)
    return sorted(seen)


def _hash(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def _file_hash(paths) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def sources_digest(root: str) -> str:
    """What the fatbin is built from: every kernels/*.cu and *.cuh, and the kernel names."""
    digest = _file_hash(sorted(glob.glob(os.path.join(root, "kernels", "*.cu*"))))
    return _hash(digest, "\n".join(kernel_names(root)))


def cache_dir() -> str:
    explicit = os.environ.get("REFLEX_KERNEL_CACHE")
    if explicit:
        return explicit
    root = os.environ.get("REFLEX_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "reflex-runtime")
    return os.path.join(root, "kernels")


class Piece:
    """One cached build product: its key, where it lives, and the command that makes it
    (the command writes to `{out}`, replaced by a temporary path that is renamed when done)."""

    def __init__(self, label: str, key: str, suffix: str, cmd: list[str], cache: str):
        self.label, self.key, self.cmd = label, key, cmd
        self.path = os.path.join(cache, key[:2], key + suffix)

    @property
    def cached(self) -> bool:
        return os.path.exists(self.path)

    def make(self) -> float:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), suffix=".part")
        os.close(fd)
        t0 = time.perf_counter()
        try:
            res = subprocess.run([a.replace("{out}", tmp) for a in self.cmd], capture_output=True, text=True)
            if res.returncode != 0:
                lines = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
                raise RuntimeError(f"{self.label}: {' '.join(lines[:12])}")
            os.replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return time.perf_counter() - t0


def _run_pieces(pieces: list[Piece], jobs: int, log, done: int, total: int, then=None) -> None:
    """Make the pieces in parallel (longest first: in the given order), a progress line as each
    ends; then(piece) -> more pieces that may start once that one is made."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        running = {pool.submit(p.make): p for p in pieces}
        try:
            while running:
                finished, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in finished:
                    piece = running.pop(fut)
                    secs = fut.result()
                    done += 1
                    log(f"reflex kernels: [{done:>{len(str(total))}}/{total}] {piece.label} ({secs:.1f} s)")
                    for nxt in (then(piece) if then else ()):
                        running[pool.submit(nxt.make)] = nxt
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def plan(nvcc: str, archs: list[int], root: str, cache: str) -> dict[int, tuple[Piece, Piece]]:
    """Per architecture: the PTX of one translation unit that includes every .cu (whole-program
    code, as one nvcc compiling them together makes), and ptxas's SASS of that PTX."""
    version = nvcc_version(nvcc)
    ptxas = toolkit_tool(nvcc, "ptxas")
    sources = kernel_sources(root)
    unit = os.path.join(cache, "src", _hash(_file_hash(sources), sources) + ".cu")  # it includes these paths
    os.makedirs(os.path.dirname(unit), exist_ok=True)
    with open(unit, "w") as f:
        f.write("".join(f'#include "{s}"\n' for s in sources))
    everything = _file_hash(sorted(glob.glob(os.path.join(root, "kernels", "*.cu*"))))
    out = {}
    for a in archs:
        ptx = Piece(f"all kernels -> PTX compute_{a}", _hash("ptx", version, NVCC_FLAGS, a, everything), ".ptx",
                    [nvcc, *NVCC_FLAGS, "--ptx", f"-arch=compute_{a}", "-o", "{out}", unit], cache)
        sass = Piece(f"PTX -> SASS sm_{a}", _hash("sass", version, a, ptx.key), ".cubin",
                     [ptxas, f"-arch=sm_{a}", "-m64", ptx.path, "-o", "{out}"], cache)
        out[a] = (ptx, sass)
    return out


def build(out_dir: str, nvcc: str, root: str = ROOT, force: bool = False, log=print, only: list[int] | None = None,
          jobs: int | None = None) -> dict:
    archs = [a for a in supported_archs(nvcc) if not only or a in only]
    if not archs:
        wanted = only or WANTED_ARCHS
        raise RuntimeError(f"{nvcc} supports none of sm_{', sm_'.join(map(str, wanted))}")
    version = nvcc_version(nvcc)
    digest = sources_digest(root)
    manifest_path = os.path.join(out_dir, MANIFEST)
    fatbin_path = os.path.join(out_dir, FATBIN)
    wanted = {"sources_sha256": digest, "nvcc": version, "sass": [f"sm_{a}" for a in archs], "ptx": f"compute_{archs[-1]}"}
    if not force and os.path.exists(fatbin_path) and os.path.exists(manifest_path):
        with open(manifest_path) as f:
            old = json.load(f)
        if all(old.get(k) == v for k, v in wanted.items()):
            log(f"reflex kernels: up to date ({fatbin_path})")
            return old
    t0, cpu0 = time.perf_counter(), _child_cpu()
    cache = cache_dir()
    pieces = plan(nvcc, archs, root, cache)
    images = [f"--image3=kind=elf,sm={a},file={pieces[a][1].path}" for a in archs]
    images.append(f"--image3=kind=ptx,sm={archs[-1]},file={pieces[archs[-1]][0].path}")
    fat = Piece("fatbin", _hash("fatbin", version, CICC_CMDLINE, [pieces[a][1].key for a in archs],
                                pieces[archs[-1]][0].key), ".fatbin",
                [toolkit_tool(nvcc, "fatbinary"), "--create={out}", "-64", f"--cicc-cmdline={CICC_CMDLINE}", *images],
                cache)
    all_pieces = [p for pair in pieces.values() for p in pair] + [fat]
    total = len(all_pieces)
    jobs = max(1, jobs or int(os.environ.get("REFLEX_BUILD_JOBS", "0")) or os.cpu_count() or 1)
    cached = sum(p.cached for p in all_pieces)
    if fat.cached:
        log(f"reflex kernels: cached build of these sources, flags and nvcc ({cache})")
    else:
        log(f"reflex kernels: {cached} of {total} pieces cached in {cache}; compiling for "
            f"{', '.join(f'sm_{a}' for a in archs)} with {jobs} jobs ({version})")
        sass_of = {ptx: sass for ptx, sass in pieces.values()}
        first = [ptx if not ptx.cached else sass for ptx, sass in pieces.values() if not sass.cached]
        first.sort(key=lambda p: p not in sass_of)  # the PTX jobs (longer) first
        _run_pieces(first, jobs, log, cached, total,
                    then=lambda p: [sass_of[p]] if p in sass_of and not sass_of[p].cached else [])
        _run_pieces([fat], 1, log, total - 1, total)
    os.makedirs(out_dir, exist_ok=True)
    shutil.copyfile(fat.path, fatbin_path + ".tmp")
    os.replace(fatbin_path + ".tmp", fatbin_path)
    for p in all_pieces:
        os.utime(p.path)  # in use: pruning keeps it
    _prune(cache)
    stats = {"pieces": total, "cached": cached, "seconds": round(time.perf_counter() - t0, 1),
             "cpu_seconds": round(_child_cpu() - cpu0, 1), "jobs": jobs}
    manifest = dict(wanted, kernels=kernel_names(root), fatbin=FATBIN, bytes=os.path.getsize(fatbin_path), build=stats)
    with open(manifest_path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(manifest_path + ".tmp", manifest_path)
    log(f"reflex kernels: {len(manifest['kernels'])} kernels, {', '.join(manifest['sass'])} + {manifest['ptx']} PTX "
        f"-> {fatbin_path} ({manifest['bytes']} bytes; {stats['seconds']} s, {stats['cpu_seconds']} CPU s)")
    return manifest


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _prune(cache: str) -> None:
    """Remove cached pieces nobody used for CACHE_DAYS (each build touches what it used)."""
    cutoff = time.time() - CACHE_DAYS * 86400
    for path in glob.glob(os.path.join(cache, "*", "*")):
        try:
            if os.path.getmtime(path) < cutoff:
                os.remove(path)
        except OSError:
            pass


def ptx_entries(nvcc: str, source: str, arch: int = 75) -> dict[str, list[int]]:
    """The `extern "C"` kernels one .cu defines and each one's parameter sizes in bytes, from its
    PTX (cached like the build's pieces; tests/test_launch_abi.py checks launches against it)."""
    sizes = {"u64": 8, "s64": 8, "b64": 8, "f64": 8, "u32": 4, "s32": 4, "b32": 4, "f32": 4, "u16": 2, "s16": 2,
             "b16": 2, "u8": 1, "s8": 1, "b8": 1}
    content = _file_hash([source] + headers_of(source))
    piece = Piece(f"{os.path.basename(source)} compute_{arch} (PTX)",
                  _hash("ptx-file", nvcc_version(nvcc), NVCC_FLAGS, arch, content), ".ptx",
                  [nvcc, *NVCC_FLAGS, "--ptx", f"-arch=compute_{arch}", "-o", "{out}", source], cache_dir())
    if not piece.cached:
        piece.make()
    with open(piece.path) as f:
        text = f.read()
    entries = {}
    for m in re.finditer(r"\.visible \.entry (\w+)\(\s*(.*?)\)", text, re.S):
        params = []
        for p in filter(None, (p.strip() for p in m.group(2).split(","))):
            arr = re.search(r"\.b8 \w+\[(\d+)\]", p)
            params.append(int(arr.group(1)) if arr else sizes[re.search(r"\.param \.(\w+)", p).group(1)])
        entries[m.group(1)] = params
    return entries


def default_out(root: str = ROOT) -> str:
    return os.path.join(root, "reflex_runtime", "_kernels")


def build_for_install(root: str = ROOT) -> None:
    """Called by the build backend. Never fails the install for a missing nvcc; a kernel that
    does not compile fails it only with REFLEX_REQUIRE_KERNELS=1 (CI sets it)."""
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    nvcc = find_nvcc()
    if nvcc is None:
        log("reflex-runtime: WARNING: nvcc not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel); the CUDA kernels "
            "were not built and the CPU reference will serve. `reflex doctor` says how to build them.")
        return
    log("reflex-runtime: compiling the CUDA kernels (REFLEX_SKIP_KERNELS=1 skips this, REFLEX_ARCHS=90 builds "
        "one architecture; README \"Building the kernels\")")
    try:
        build(default_out(root), nvcc, root, log=log, only=requested_archs(None))
    except (subprocess.CalledProcessError, RuntimeError, OSError) as e:
        if os.environ.get("REFLEX_REQUIRE_KERNELS") == "1":
            raise
        log(f"reflex-runtime: WARNING: building the CUDA kernels failed ({e}); the CPU reference will serve.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default_out())
    ap.add_argument("--nvcc", default=None)
    ap.add_argument("--force", action="store_true", help="rebuild the fatbin even if the manifest says it is current")
    ap.add_argument("--archs", default=None, metavar="90[,100]",
                    help="only these SM architectures (default $REFLEX_ARCHS, else all; the package ships all of them)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default $REFLEX_BUILD_JOBS, else one per core)")
    args = ap.parse_args()
    nvcc = args.nvcc or find_nvcc()
    if nvcc is None:
        print("nvcc not found: install the CUDA toolkit or `pip install nvidia-cuda-nvcc`", file=sys.stderr)
        return 1
    try:
        build(args.out, nvcc, force=args.force, only=requested_archs(args.archs), jobs=args.jobs)
    except RuntimeError as e:
        print(f"build_kernels: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
