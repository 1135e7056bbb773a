"""PEP 517 backend: setuptools, plus compiling the CUDA kernels into one fatbin first.

The fatbin is written to reflex_runtime/_kernels/ (ignored by git) so that both wheels and
editable installs carry it. No nvcc found: the install still succeeds with one warning, and
the runtime serves from the CPU reference (`reflex doctor` says how to build the kernels).
"""

import importlib.util
import os
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (re-export every hook)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build_kernels() -> None:
    if os.environ.get("REFLEX_SKIP_KERNELS") == "1":
        print("reflex-runtime: REFLEX_SKIP_KERNELS=1, not building the CUDA kernels", file=sys.stderr)
        return
    path = os.path.join(_ROOT, "scripts", "build_kernels.py")
    spec = importlib.util.spec_from_file_location("reflex_build_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.build_for_install(_ROOT)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _build_kernels()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _build_kernels()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
