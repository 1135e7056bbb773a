"""The background fixture build of a whole-suite run (scripts/prebuild_fixtures.py, started by
tests/conftest.py): its list, its stop rule, and when conftest starts it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import prebuild_fixtures as pb
from conftest import whole_suite_run


def test_the_list_is_a_recorded_run_in_first_use_order(tmp_path):
    record = tmp_path / "record.jsonl"
    uses = [("qwen3", "f32", {}), ("gemma3", "f32", {}), ("qwen3", "f32", {}), ("qwen3", "q8_0", {"a": [1, 2]}),
            ("gemma3", "f32", {})]
    record.write_text("".join(json.dumps({"arch": a, "outtype": o, "seed": 0, "overrides": ov}) + "\n" for a, o, ov in uses))
    out = tmp_path / "list.json"
    assert pb.write_list(record, out) == 3
    assert [(e["arch"], e["outtype"], e["overrides"]) for e in json.loads(out.read_text())] == \
        [("qwen3", "f32", {}), ("gemma3", "f32", {}), ("qwen3", "q8_0", {"a": [1, 2]})]


def test_make_fixture_records_each_use(tmp_path, monkeypatch, fixture_paths):
    import fixtures

    fixture_paths("gemma3", "f32")  # cached: the recorded call below only looks it up
    monkeypatch.setenv("REFLEX_RECORD_FIXTURES", str(tmp_path / "record.jsonl"))
    fixtures.make_fixture("gemma3", "F32", 0)
    assert json.loads((tmp_path / "record.jsonl").read_text()) == {"arch": "gemma3", "outtype": "f32", "seed": 0,
                                                                   "overrides": {}}


def test_build_goes_in_order_skips_failures_and_stops_when_told():
    made, stop_after = [], 3

    def make(arch, outtype, seed, **overrides):
        made.append(arch)
        if arch == "b":
            raise RuntimeError("converter failed")

    entries = [{"arch": a, "outtype": "f32", "seed": 0, "overrides": {}} for a in "abcde"]
    lines = []
    n = pb.build(entries, make, stop=lambda: len(made) >= stop_after, log=lines.append)
    assert made == ["a", "b", "c"] and n == 2
    assert any(line.startswith("failed: b f32") for line in lines) and lines[-1] == "stopped"


def test_the_committed_list_names_real_fixtures():
    from fixtures import ARCHS, CONVERTER_TYPES
    from quantize_gguf import SCHEMES

    entries = json.loads(pb.DEFAULT_LIST.read_text())
    assert len(entries) >= 50
    for e in entries:
        assert set(e) == set(pb.KEYS) and e["arch"] in ARCHS and isinstance(e["overrides"], dict), e
        assert e["outtype"] in CONVERTER_TYPES or e["outtype"].upper() in SCHEMES, e


def test_only_a_whole_suite_run_prebuilds(monkeypatch):
    monkeypatch.delenv("REFLEX_TEST_PREBUILD", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

    def config(paths=(), markexpr="not gpu", collectonly=False):
        return SimpleNamespace(option=SimpleNamespace(file_or_dir=list(paths), markexpr=markexpr, collectonly=collectonly))

    assert whole_suite_run(config())
    assert not whole_suite_run(config(paths=["tests/test_cli.py"]))
    assert not whole_suite_run(config(markexpr="gpu"))
    assert not whole_suite_run(config(collectonly=True))
    monkeypatch.setenv("REFLEX_TEST_PREBUILD", "0")
    assert not whole_suite_run(config())
    monkeypatch.delenv("REFLEX_TEST_PREBUILD")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert not whole_suite_run(config())


def test_it_stops_on_sigterm_or_when_its_test_run_is_gone():
    import os
    import signal

    before = signal.getsignal(signal.SIGTERM)
    try:
        stop = pb.Stop(os.getppid())
        assert not stop()
        os.kill(os.getpid(), signal.SIGTERM)  # the handler only takes note: the fixture in hand completes
        assert stop()
        assert pb.Stop(-1)()  # started by a process that is no longer its parent
    finally:
        signal.signal(signal.SIGTERM, before)
