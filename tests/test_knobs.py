"""The REFLEX_* tuning variables the launcher reads (gpu/launch.py knob): a value that does not
parse or is out of range is a one-line BadSetting naming the variable, never a traceback."""

from types import SimpleNamespace

import pytest

from reflex_runtime.errors import BadSetting, DeviceError
from reflex_runtime.gpu.launch import Launcher, knob

DEV = SimpleNamespace(sm_count=132, cc=(9, 0), max_shared=232448, smem_per_sm=233472)


@pytest.mark.parametrize("name,value,says", [
    ("REFLEX_MOE_TILE", "48", "one of 0, 32, 64"),
    ("REFLEX_MOE_TILE", "abc", "an integer"),
    ("REFLEX_ATTN_HEAD_GROUPS", "0", "from 1 to 64"),
    ("REFLEX_ATTN_BLOCKS_PER_SM", "nan", "from 0.25 to 64"),
    ("REFLEX_ATTN_BLOCKS_PER_SM", "inf", "from 0.25 to 64"),
    ("REFLEX_ATTN_BLOCKS_PER_SM", "four", "a number"),
    ("REFLEX_MVS_BUDGET", "-1", "at least 0"),
    ("REFLEX_MVS_BLOCKS_PER_SM", "2.5", "an integer"),
    ("REFLEX_ATTN_MIN_KEYS", "0", "at least 1"),
    ("REFLEX_MVS_HEAD_STREAM", "4", "one of 0, 1, 2"),
    ("REFLEX_POST_FOLD", "yes", "an integer"),
    ("REFLEX_SMEM_CARVEOUT", "101", "from -1 to 100"),
    ("REFLEX_SMEM_CARVEOUT", "max", "an integer"),
    ("REFLEX_ATTN_OUT_MERGE", "9", "from 0 to 8"),
    ("REFLEX_ATTN_OUT_MERGE_K", "-1", "at least 0"),
    ("REFLEX_ATTN_GROUP_KERNELS", "2", "one of 0, 1"),
    ("REFLEX_ATTN_GROUP_KERNELS", "on", "an integer"),
    ("REFLEX_ATTN_TC", "2", "one of 0, 1"),
    ("REFLEX_ATTN_TC", "yes", "an integer"),
    ("REFLEX_ATTN_TC_MIN_KEYS", "-1", "at least 0"),
    ("REFLEX_ATTN_TC_FROM", "-5", "at least 0"),
    ("REFLEX_PROMPT_SPLITS", "2", "one of 0, 1"),
])
def test_a_bad_tuning_variable_is_one_line_naming_it(monkeypatch, name, value, says):
    monkeypatch.setenv(name, value)
    with pytest.raises(BadSetting) as e:
        Launcher(DEV, stream=None)
    msg = str(e.value)
    assert name in msg and says in msg and "\n" not in msg
    assert isinstance(e.value, DeviceError) and e.value.exit_code == DeviceError.exit_code


def test_good_and_unset_tuning_variables(monkeypatch):
    monkeypatch.setenv("REFLEX_MOE_TILE", "32")
    monkeypatch.setenv("REFLEX_ATTN_BLOCKS_PER_SM", " 2.5 ")
    monkeypatch.setenv("REFLEX_ATTN_HEAD_GROUPS", "")
    L = Launcher(DEV, stream=None)
    assert (L.moe_tile, L.attn_blocks_per_sm, L.attn_head_groups) == (32, 2.5, 4)
    assert L.carveout == 100  # the decode graph's kernels: all of the SM's L1 / shared memory as shared memory
    assert knob("REFLEX_NOT_SET_ANYWHERE", 7) == 7
