"""kernels/rope.cu on the CPU (tests/host_emu_harness.py): the GPU tests' own checks
(tests/test_gpu_kernels.py: float64 reference, NaN-poisoned caches) with the real Launcher's
shapes and argument packs, every head grouping the launcher can pick."""

from __future__ import annotations

import pytest

import test_gpu_kernels as G
from host_emu_harness import build_host_harness


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host_harness(tmp_path_factory.mktemp("emu"), "rope_host.cpp", "rope.cu")


@pytest.mark.parametrize("case", list(G.ROPE_CASES))
def test_qk_norm_rope_and_cache_store(host, case):
    G.test_qk_norm_rope_and_cache_store(host, case)


@pytest.mark.parametrize("groups", G.ROPE_GROUPS[1:], ids=str)
def test_head_groups(host, monkeypatch, groups):
    G.test_qk_rope_store_head_groups(host, monkeypatch, groups)
