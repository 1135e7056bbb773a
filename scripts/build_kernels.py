#!/usr/bin/env python3
"""Compile kernels/*.cu ahead of time into ONE fatbin plus a manifest of kernel names.

    python scripts/build_kernels.py [--out DIR] [--nvcc PATH] [--force]

SASS for every listed architecture the toolkit knows (sm_75 ... sm_120) and PTX for the newest,
so a listed GPU never JITs and a newer one still runs. nvcc is found through $NVCC, PATH,
$CUDA_HOME, /usr/local/cuda, or the nvidia-cuda-nvcc wheels. The package's build backend calls
build_for_install(); without nvcc it warns once and the runtime serves from the CPU reference.
Nothing is compiled at run time, ever.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig

WANTED_ARCHS = (75, 80, 86, 89, 90, 100, 120)
FATBIN = "reflex.fatbin"
MANIFEST = "manifest.json"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kernel_names(root: str = ROOT) -> list[str]:
    path = os.path.join(root, "reflex_runtime", "gpu", "kernels.py")
    spec = importlib.util.spec_from_file_location("reflex_kernel_table", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return list(mod.KERNEL_NAMES)


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


def supported_archs(nvcc: str) -> list[int]:
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
        have = {int(a.split("_")[1]) for a in out.split() if a.startswith("compute_")}
    except (subprocess.CalledProcessError, ValueError):
        have = {75, 80, 86, 89, 90}  # old nvcc without --list-gpu-arch
    return [a for a in WANTED_ARCHS if a in have]


def sources_digest(root: str) -> str:
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(root, "kernels", "*.cu*"))):
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    h.update("\n".join(kernel_names(root)).encode())
    return h.hexdigest()


def build(out_dir: str, nvcc: str, root: str = ROOT, force: bool = False, log=print, only: list[int] | None = None) -> dict:
    archs = [a for a in supported_archs(nvcc) if not only or a in only]
    if not archs:
        raise RuntimeError(f"{nvcc} supports none of sm_{', sm_'.join(map(str, WANTED_ARCHS))}")
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
    os.makedirs(out_dir, exist_ok=True)
    cmd = [nvcc, "-O3", "--fatbin", "-std=c++17", "--threads", "0", "-o", fatbin_path + ".tmp"]
    for a in archs:
        cmd += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    cmd += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]
    cmd.append(os.path.join(root, "kernels", "all.cu"))
    log(f"reflex kernels: {' '.join(cmd)}")
    subprocess.run(cmd, check=True)
    os.replace(fatbin_path + ".tmp", fatbin_path)
    manifest = dict(wanted, kernels=kernel_names(root), fatbin=FATBIN, bytes=os.path.getsize(fatbin_path))
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
    log(f"reflex kernels: {len(manifest['kernels'])} kernels, {', '.join(manifest['sass'])} + {manifest['ptx']} PTX "
        f"-> {fatbin_path} ({manifest['bytes']} bytes)")
    return manifest


def default_out(root: str = ROOT) -> str:
    return os.path.join(root, "reflex_runtime", "_kernels")


def build_for_install(root: str = ROOT) -> None:
    """Called by the build backend. Never fails the install for a missing nvcc."""
    nvcc = find_nvcc()
    if nvcc is None:
        print("reflex-runtime: WARNING: nvcc not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel); the CUDA kernels "
              "were not built and the CPU reference will serve. `reflex doctor` says how to build them.", file=sys.stderr)
        return
    try:
        build(default_out(root), nvcc, root, log=lambda m: print(m, file=sys.stderr))
    except (subprocess.CalledProcessError, RuntimeError, OSError) as e:
        if os.environ.get("REFLEX_REQUIRE_KERNELS") == "1":
            raise
        print(f"reflex-runtime: WARNING: building the CUDA kernels failed ({e}); the CPU reference will serve.",
              file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default_out())
    ap.add_argument("--nvcc", default=None)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--archs", default=None, metavar="90[,100]",
                    help="only these SM architectures (a quick build for one GPU; the package ships all of them)")
    args = ap.parse_args()
    nvcc = args.nvcc or find_nvcc()
    if nvcc is None:
        print("nvcc not found: install the CUDA toolkit or `pip install nvidia-cuda-nvcc`", file=sys.stderr)
        return 1
    only = [int(a) for a in args.archs.split(",")] if args.archs else None
    build(args.out, nvcc, force=args.force, only=only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
