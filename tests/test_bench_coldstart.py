"""scripts/bench_coldstart.py's own logic, without a GPU: interleaving, the record-vs-external
energy comparison, variants and usage errors."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import bench_coldstart as bc  # noqa: E402


def test_interleaved_rounds_rotate_and_time_every_case(tmp_path):
    order = tmp_path / "order.txt"
    cases = [bc.Case(n, ["sh", "-c", f"echo {n} >> {order}; echo out"]) for n in ("a", "b", "c")]
    summaries, diffs = bc.run_interleaved(cases, 3, None, None, 0.0)
    assert [s["case"] for s in summaries] == ["a", "b", "c"]
    assert all(s["runs"] == 3 and s["failures"] == 0 for s in summaries)
    assert all(s["spawn_to_first_output_s"]["p50"] > 0 for s in summaries)
    runs = order.read_text().split()
    assert runs[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # after one untimed run each
    assert set(diffs["minus_reference_first_output_ms"]) == {"b", "c"}


def test_net_agreement_is_within_3_j_or_20_percent():
    rows = [{"child_net_joules": a, "net_joules_to_first_output": b} for a, b in ((24, 26), (23, 27.5), (30, 25))]
    r = bc.net_agreement(rows)
    assert r["record_median_j"] == 24 and r["external_median_j"] == 26
    assert r["bound_j"] == 5.2 and r["agree"] and r["runs_within_bound"] == 3  # 20% of 26 J beats 3 J
    small = bc.net_agreement([{"child_net_joules": 0.2, "net_joules_to_first_output": 4.0}])
    assert small["bound_j"] == 3.0 and not small["agree"]  # the 2026-12-01 figure (0.13 J against ~25 J) fails
    assert bc.net_agreement([{"child_net_joules": None, "net_joules_to_first_output": 4.0}]) is None


def test_energy_agreement_uses_one_counter_step_or_20_percent():
    class Clock:
        step_j = 12.0

    rows = [{"child_joules_process_start_to_first_token": a, "joules_to_first_output": b}
            for a, b in ((50, 58), (52, 61), (49, 60))]
    r = bc.energy_agreement(rows, Clock())
    assert r["record_median_j"] == 50 and r["external_median_j"] == 60
    assert r["bound_j"] == 12.0 and r["agree"]  # 10 J apart: within one 12 J step (20% would be 12 J too)
    rows = [{"child_joules_process_start_to_first_token": 20, "joules_to_first_output": 60}]
    assert not bc.energy_agreement(rows, Clock())["agree"]
    assert bc.energy_agreement([{"child_joules_process_start_to_first_token": None, "joules_to_first_output": 60}],
                               Clock()) is None


def test_variants_and_long_prompts():
    assert bc.parse_variant("late:REFLEX_NVML_START=after_context,REFLEX_NVML_FLAGS=2") == (
        "late", {"REFLEX_NVML_START": "after_context", "REFLEX_NVML_FLAGS": "2"})
    with pytest.raises(SystemExit):
        bc.parse_variant("bad:PATH=/tmp")
    words = bc.long_prompt(1000).split()
    assert 800 <= len(words) <= 900


def test_usage_errors_are_one_line():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_coldstart.py"), "--runs", "0", "--out", "/tmp/x"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--runs must be at least 1" in r.stderr and "Traceback" not in r.stderr


def test_a_child_that_floods_stderr_does_not_hang_the_benchmark():
    """llama.cpp writes more to stderr than a pipe holds while the benchmark reads stdout."""
    flood = [sys.executable, "-c", "import sys; sys.stderr.write('x' * 400000); sys.stderr.flush(); print('out')"]
    row = bc.run_once(flood, None, dict(os.environ))
    assert row["rc"] == 0 and row["spawn_to_first_output_s"] is not None and row["spawn_to_exit_s"] < 30
    assert row["stderr_tail"].endswith("x")


def test_a_tree_runs_its_own_package_before_the_working_directory(tmp_path):
    """--tree A/B: the child imports reflex_runtime from the given checkout, not from the
    working directory (which `python -m` would put first)."""
    pkg = tmp_path / "reflex_runtime"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("import sys\nif __name__ == '__main__':\n    print('other tree', sys.argv[1:])\n")
    assert bc.parse_tree(f"old={tmp_path}:{tmp_path}/k") == ("old", str(tmp_path), f"{tmp_path}/k")
    with pytest.raises(SystemExit):
        bc.parse_tree(f"old={tmp_path}/nothing")
    r = subprocess.run(bc.tree_cmd(str(tmp_path)) + ["generate", "hi"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "other tree ['generate', 'hi']", r.stderr


def test_compare_rows_put_reflex_against_llama_simple_per_page_cache_state(tmp_path):
    """cold_first_token_s (warm page cache), @dropped (cold) and joules_to_first_token, as
    ../shared/RESULTS.md has them: ratio = peer / reflex for times and joules; a variant's case
    (reflex generate F [whole]) is not the reflex figure; rows merge into an existing compare.json."""
    from compare_json import write_compare

    def case(name, cache, s, j=None):
        c = {"case": name, "page_cache": cache, "spawn_to_first_output_s": {"p50": s}}
        if j is not None:
            c["joules_to_first_output"] = {"p50": j}
        return c

    f = "m-30b-q8_0.gguf"
    result = {"gpu": "G", "cases": [case(f"reflex generate {f}", "warm", 1.0, 150.0),
                                    case(f"reflex generate {f} [whole]", "warm", 1.8, 260.0),
                                    case(f"llama-simple {f}", "warm", 5.0, 800.0),
                                    case(f"reflex generate {f}", "cold", 4.0), case(f"llama-simple {f}", "cold", 12.0)]}
    rows = bc.compare_rows(result, f)
    assert [(r["metric"], r["reflex"], r["llama_cpp"], r["ratio"]) for r in rows] == [
        ("cold_first_token_s", 1.0, 5.0, 5.0), ("joules_to_first_token", 150.0, 800.0, 5.333),
        ("cold_first_token_s@dropped", 4.0, 12.0, 3.0)]
    assert {r["file"] for r in rows} == {"m-30b-q8_0"}
    out = tmp_path / "compare.json"
    write_compare(out, [{"file": "other", "metric": "tg128", "reflex": 2, "llama_cpp": 1, "ratio": 2}], "G", "aaa")
    write_compare(out, rows, "G", "bbb")
    import json

    got = json.loads(out.read_text())
    assert len(got["rows"]) == 4 and {r["commit"] for r in got["rows"]} == {"aaa", "bbb"}


def test_rows_from_earlier_results_name_the_tree_given(tmp_path):
    """--rows-from: the rows of a results.json written on a GPU machine (whose git may name another
    commit), labelled with --commit; a results.json without a llama-simple case is a one-line error."""
    import json

    f = "m-30b-q8_0.gguf"
    res = tmp_path / "results.json"
    res.write_text(json.dumps({"gpu": "G", "cases": [
        {"case": f"reflex generate {f}", "page_cache": "warm", "spawn_to_first_output_s": {"p50": 0.75}},
        {"case": f"reflex generate {f} [thp]", "page_cache": "warm", "spawn_to_first_output_s": {"p50": 0.7}},
        {"case": f"llama-simple {f}", "page_cache": "warm", "spawn_to_first_output_s": {"p50": 6.0}}]}))
    script = [sys.executable, os.path.join(ROOT, "scripts", "bench_coldstart.py")]
    out = tmp_path / "compare.json"
    r = subprocess.run(script + ["--rows-from", str(res), "--compare-out", str(out), "--commit", "abc1234"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [(x["file"], x["metric"], x["reflex"], x["ratio"], x["commit"]) for x in json.loads(out.read_text())["rows"]] == [
        ("m-30b-q8_0", "cold_first_token_s", 0.75, 8.0, "abc1234")]
    res.write_text(json.dumps({"gpu": "G", "cases": [
        {"case": f"reflex generate {f}", "page_cache": "warm", "spawn_to_first_output_s": {"p50": 0.75}}]}))
    r = subprocess.run(script + ["--rows-from", str(res), "--compare-out", str(out)], capture_output=True, text=True)
    assert r.returncode == 1 and "no `reflex generate` case with a llama-simple case" in r.stderr
    r = subprocess.run(script + ["--rows-from", str(res)], capture_output=True, text=True)
    assert r.returncode == 2 and "--rows-from needs --compare-out" in r.stderr and "Traceback" not in r.stderr
    for bad in ("{not json", '{"cases": 3}', "[]"):  # malformed or another file: one line, exit 2, compare.json untouched
        before = out.read_text()
        res.write_text(bad)
        r = subprocess.run(script + ["--rows-from", str(res), "--compare-out", str(out)], capture_output=True, text=True)
        assert r.returncode == 2 and "is not a results.json" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert out.read_text() == before
    r = subprocess.run(script + ["--rows-from", str(tmp_path / "none.json"), "--compare-out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "none.json" in r.stderr and "Traceback" not in r.stderr


def test_disk_read_rate_reads_the_file_head_on_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(bc, "drop_page_cache", lambda path: "test")  # not this machine's whole page cache
    f = tmp_path / "m.gguf"
    f.write_bytes(os.urandom(3_000_000))
    r = bc.disk_read_rate(str(f), nbytes=2_000_000, threads=3, chunk=300_000)
    assert r["bytes"] == 2_000_000 and r["threads"] == 3 and r["gb_s"] > 0 and r["cache_drop_method"]
    assert bc.disk_read_rate(str(f), threads=2)["bytes"] == 3_000_000  # never past the end


def test_the_child_records_upload_figures_are_summarized():
    """What the first token waited for, per case: the records' upload fields, medians."""
    def rec(ms, resident):
        return {"upload_ms": ms, "base_bytes": 100, "resident_bytes_at_release": resident, "weights_bytes": 1000,
                "coldstart": {"stages": [{"stage": "first_token", "at_ms": 900.0}], "background": {},
                              "process_start_to_first_token_ms": 900.0}}

    st = bc._median_stages([rec(10.0, 300), rec(30.0, 500), rec(20.0, 400)])
    assert st["upload"] == {"weights_bytes": 1000, "upload_ms": 20.0, "base_bytes": 100, "resident_bytes_at_release": 400}
    assert "upload" in bc._median_stages([rec(5.0, None)]) and "resident_bytes_at_release" not in \
        bc._median_stages([rec(5.0, None)])["upload"]
