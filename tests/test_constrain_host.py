"""kernels/constrain.cu on the CPU (tests/host_emu_harness.py): the GPU tests' own checks
(tests/test_gpu_constrained.py) with the real Launcher's shapes and argument packs."""

from __future__ import annotations

import pytest

import test_gpu_constrained as G
from host_emu_harness import build_host_harness
from reflex_runtime.gpu.ops.constrain import STATS_PARTS


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return build_host_harness(tmp_path_factory.mktemp("emu"), "constrain_host.cpp", "constrain.cu")


@pytest.mark.parametrize("n", G.ROW_LENGTHS)
@pytest.mark.parametrize("k", G.K_VALUES)
@pytest.mark.parametrize("parts", [1, 7, STATS_PARTS])
def test_logit_stats(host, n, k, parts):
    G.check_logit_stats(host, n, k, parts, seed=n * 31 + k * 7 + parts)


@pytest.mark.parametrize("n", [1, 33, 4099])
def test_mask_and_token_logit(host, n):
    G.check_mask(host, n, seed=n)
    G.check_token_logit(host, n, seed=n + 1)
