"""The printed table and the JSON report."""

import json

from hybridflow.loadgen.report import build_report, environment, format_table
from hybridflow.loadgen.stats import RequestRecord, summarize


def summaries():
    ok = [RequestRecord(0.0, 0.0, 0.25, "OK", 0.1, 40, 4), RequestRecord(0.5, 0.5, 1.0, "OK")]
    bad = [RequestRecord(0.0, 0.0, 0.5, "UNAVAILABLE")] * 2
    return [summarize(ok, "open", 2.0, 0.0), summarize(bad, "open", 4.0, 0.0)]


def test_table_has_one_row_per_run_with_units_of_the_target():
    runs = summaries()
    runs[1].client_cpu_pct = 12.34
    table = format_table(runs, "rollout").splitlines()
    assert len(table) == 4  # header, rule, two runs
    assert "tok/s" in table[0] and "ttfr p50" in table[0]
    first = table[2].split()
    # mode load sent ok err sent/s req/s tok/s p50 p90 p99 ttfr lag cpu% errors
    assert first == ["open", "2", "2", "2", "0", "4.00", "2.00", "40.0", "375.0", "475.0",
                     "497.5", "100.0", "0.0", "-", "-"]  # fmt: skip
    assert table[3].split()[-2:] == ["12", "UNAVAILABLE=2"] and table[3].split()[8] == "-"
    assert "items/s" in format_table(summaries(), "reward").splitlines()[0]


def test_report_is_json_with_config_environment_and_runs():
    report = build_report({"target": "reward"}, summaries(), environment())
    text = json.dumps(report)
    back = json.loads(text)
    assert back["config"] == {"target": "reward"}
    assert back["environment"]["cpu_count"] >= 1 and back["environment"]["grpcio"]
    assert [r["load"] for r in back["runs"]] == [2.0, 4.0]
    assert back["runs"][0]["latency_ms"]["p50"] == 375.0
    assert back["runs"][1]["errors"] == {"UNAVAILABLE": 2}
