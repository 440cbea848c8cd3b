"""bench/compare.py's verdicts: a ratio that fell by more than its noise is
a regression, in the direction its target names; the noise is measured on
runs of one commit. Pure logic, no database."""

from __future__ import annotations

import json

import pytest

from bench import compare
from bench.bench_all import evaluate, last_json, table


def result(sha: str = "abc", **values: tuple[str, float]) -> dict:
    return {
        "commit": {"sha": sha},
        "ratios": [{"name": n, "op": op, "value": v} for n, (op, v) in values.items()],
    }


def verdicts(a: dict, b: dict, noise: dict) -> dict[str, str]:
    return {r["name"]: r["verdict"] for r in compare.compare(a, b, noise)}


def test_a_fall_beyond_the_band_regresses_in_the_targets_direction():
    noise = {"bands": {"rate": 0.10, "p99": 0.10, "errors": 0.0}}
    a = result(rate=(">=", 1.0), p99=("<=", 1.0), errors=("==", 0))
    # A higher-is-better ratio down 20 %, a lower-is-better one up 20 %.
    b = result(rate=(">=", 0.8), p99=("<=", 1.2), errors=("==", 3))
    assert verdicts(a, b, noise) == {
        "rate": "regressed",
        "p99": "regressed",
        "errors": "regressed",
    }
    # The same moves the other way are improvements, and small ones are noise.
    b = result(rate=(">=", 1.2), p99=("<=", 0.8), errors=("==", 0))
    assert verdicts(a, b, noise) == {
        "rate": "improved",
        "p99": "improved",
        "errors": "within noise",
    }
    b = result(rate=(">=", 0.95), p99=("<=", 1.05), errors=("==", 0))
    assert set(verdicts(a, b, noise).values()) == {"within noise"}


def test_an_unmeasured_ratio_takes_the_default_band_and_new_or_gone_ones_are_named():
    a = result(rate=(">=", 1.0), old=(">=", 1.0))
    b = result(rate=(">=", 0.8), new=(">=", 1.0))
    got = verdicts(a, b, {"default_band": 0.25})
    assert got == {"rate": "within noise", "old": "gone", "new": "new"}
    assert "default" in compare.render(compare.compare(a, b, {"default_band": 0.25}))


def test_main_exits_1_on_a_regression(tmp_path, capsys):
    pa, pb, pn = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "noise.json"
    pa.write_text(json.dumps(result(rate=(">=", 1.0))))
    pb.write_text(json.dumps(result(rate=(">=", 0.5))))
    pn.write_text(json.dumps({"bands": {"rate": 0.1}}))
    assert compare.main([str(pa), str(pb), "--noise", str(pn)]) == 1
    assert "REGRESSED" in capsys.readouterr().out
    assert compare.main([str(pa), str(pa), "--noise", str(pn)]) == 0


def test_noise_is_measured_on_one_commit_only():
    runs = [result(rate=(">=", 1.0), n=(">=", 5.0)), result(rate=(">=", 0.9), n=(">=", 5.0))]
    noise = compare.measure_noise(runs)
    # 1.5 x the 10 % spread; an identical count gets the floor.
    assert noise["bands"] == {"rate": 0.15, "n": compare.MIN_BAND}
    mixed = [result("a", rate=(">=", 1.0)), result("b", rate=(">=", 1.0))]
    with pytest.raises(ValueError, match="one commit"):
        compare.measure_noise(mixed)
    # Allowed only when asked, and then the file names both commits.
    assert compare.measure_noise(mixed, mixed_commits=True)["commits"] == ["a", "b"]


def test_files_from_two_kinds_of_machine_are_compared_only_when_asked(tmp_path, capsys):
    intel = {"cores": 2, "model": "Intel(R) Xeon(R) Processor", "host": "a"}
    amd = {"cores": 2, "model": "AMD EPYC", "host": "b"}
    pa, pb, pn = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "noise.json"
    pa.write_text(json.dumps({**result(rate=(">=", 1.0)), "machine": intel}))
    pb.write_text(json.dumps({**result(rate=(">=", 1.0)), "machine": amd}))
    pn.write_text(json.dumps({"bands": {"rate": 0.1}, "runs": [{"machine": intel}]}))
    assert compare.main([str(pa), str(pb), "--noise", str(pn)]) == 2
    assert "different kinds of machine" in capsys.readouterr().err
    assert compare.main([str(pa), str(pb), "--noise", str(pn), "--across-machines"]) == 0
    out = capsys.readouterr().out
    assert "ACROSS MACHINES" in out and "measured on 2 cores, Intel" in out, out
    # Another host of the same kind is the same machine for this purpose.
    pb.write_text(json.dumps({**result(rate=(">=", 1.0)), "machine": {**intel, "host": "c"}}))
    assert compare.main([str(pa), str(pb), "--noise", str(pn)]) == 0
    assert "measured on" not in capsys.readouterr().out
    with pytest.raises(ValueError, match="one kind of machine"):
        compare.measure_noise([{**result(), "machine": intel}, {**result(), "machine": amd}])


def test_a_kind_of_machine_with_its_own_bands_is_judged_by_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compare, "NOISE_DIR", tmp_path)
    amd = {"cores": 2, "model": "AMD EPYC"}
    assert compare.noise_file(compare.machine_kind({"machine": amd})) == compare.NOISE
    (tmp_path / "2-cores-amd-epyc.json").write_text(json.dumps({"bands": {"rate": 0.3}}))
    assert compare.noise_file("2 cores, AMD EPYC") == tmp_path / "2-cores-amd-epyc.json"
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps({**result(rate=(">=", 1.0)), "machine": amd}))
    pb.write_text(json.dumps({**result(rate=(">=", 0.8)), "machine": amd}))
    # A 20 % fall: within this kind's 30 %, beyond the shared file's band.
    assert compare.main([str(pa), str(pb)]) == 0
    assert "2-cores-amd-epyc.json" in capsys.readouterr().out
    shared = tmp_path / "shared.json"
    shared.write_text(json.dumps({"bands": {"rate": 0.1}}))
    assert compare.main([str(pa), str(pb), "--noise", str(shared)]) == 1


def test_bench_all_reads_the_summary_line_and_judges_each_target():
    out = 'text\n{"bench": "admission"}\n{"not": "last"\n'
    assert last_json(out) == {"bench": "admission"}
    rows = evaluate({"http": {"tickets_c8": {"ratio_to_floor": 0.7, "p99_ms": 30},
                              "floor_c8": {"p99_ms": 25},
                              "tickets_c32": {"errors": 0}}})  # fmt: skip
    by_name = {r["name"]: r for r in rows}
    assert by_name["http.c8_vs_floor"]["met"] is False
    assert by_name["http.c8_p99_vs_floor_p99"] == {**by_name["http.c8_p99_vs_floor_p99"],
                                                   "value": 1.2, "met": True}  # fmt: skip
    assert by_name["http.c32_errors"]["met"] is True
    assert "error" in by_name["http.c32_vs_floor"]  # missing from the summary: named, not hidden
    assert "NO" in table(rows)


def test_bench_all_judges_concurrency_at_the_database_and_through_the_stack():
    summary = {
        "ratio": {"1": {"admit_vs_procrastinate": 1.2},
                  "32": {"admit_vs_procrastinate": 1.4, "admit_vs_insert": 0.3}},
        "admit_32_vs_8": 1.1,
        "http": {"c32": {"ratio_to_floor": 0.85, "tickets": {"errors": 2}}},
        "e2e": {"c2": {"worst_rep": {"claimcheck_vs_procrastinate": 1.6,
                                     "claimcheck_vs_celery": 0.5}}},
    }  # fmt: skip
    got = {r["name"]: r.get("met") for r in evaluate({"concurrency": summary})}
    assert got == {
        "concurrency.admit_c1_vs_procrastinate": True,
        "concurrency.admit_c32_vs_procrastinate": False,
        "concurrency.admit_32_vs_8": True,
        "concurrency.admit_c32_vs_insert": True,
        "concurrency.http_c32_vs_floor": True,
        "concurrency.http_c32_errors": False,
        "concurrency.e2e_c2_vs_procrastinate_worst_rep": True,
        "concurrency.e2e_c2_vs_celery_worst_rep": False,
    }
