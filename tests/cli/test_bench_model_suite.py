"""``python -m fastattn bench --suite model``: its list and its table (the
run itself takes minutes: it is a benchmark, not a test)."""

from fastattn.bench.cli import main
from fastattn.bench.model import format_records


def test_model_suite_lists_its_cases_per_thread_count(capsys):
    assert main(["--suite", "model", "--list", "--threads", "1,2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6
    assert lines[0].startswith("MiniLM forward 32x256") and "sdpa, eager, fastattn" in lines[0]
    assert lines[1].startswith("tiny Llama generate 1024+64")
    assert lines[2].startswith("fastattn.torch 3x2 call") and "eager" not in lines[2]
    assert lines[3].endswith("threads=2")


def test_model_suite_table_shows_times_ratios_shares_and_checks():
    share = {"sdpa": 0.16, "eager": 0.45, "fastattn": 0.1}
    recs = [{"case": "MiniLM forward 32x256", "threads": 2, "unit": "s", "sdpa": 0.8,
             "eager": 1.4, "fastattn": 0.7, "fastattn/sdpa": 0.88, "attention_share": share,
             "max_abs_diff_vs_sdpa": 5e-6},
            {"case": "tiny Llama generate 1024+64", "threads": 2, "unit": "tokens/s",
             "sdpa": 30.0, "eager": 20.0, "fastattn": 33.0, "fastattn/sdpa": 1.1,
             "attention_share": share, "same_tokens": False}]
    text = format_records(recs)
    assert "800 ms" in text and "700 ms" in text and "0.88x" in text and "16%/45%/10%" in text
    assert "33.0" in text and "1.10x" in text
    assert "within 5.0e-06 of sdpa" in text and "NEW TOKENS DIFFER" in text
