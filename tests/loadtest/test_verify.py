"""`spillway loadtest verify`'s comparison of a reloaded answer with its recompute, as vLLM's completions answer
them (return_token_ids, logprobs keyed by id), and its bad input as one line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from spillway.loadtest.verify import compare, parse_answer, rejudge


def reply(ids: list[int], chosen: list[float], top: list[dict[int, float]]) -> bytes:
    """A /v1/completions body the way vLLM writes it with return_token_ids and return_tokens_as_token_ids."""
    return json.dumps({"choices": [{"text": "", "token_ids": ids, "logprobs": {
        "tokens": [f"token_id:{i}" for i in ids], "token_logprobs": chosen,
        "top_logprobs": [{f"token_id:{k}": v for k, v in entry.items()} for entry in top]}}]}).encode()


RECOMPUTED = parse_answer(reply([5, 7, 9], [-0.1, -0.70, -0.2], [{5: -0.1, 6: -3.0}, {7: -0.70, 8: -0.705},
                                                                 {9: -0.2}]))


def test_the_same_tokens_are_the_same_answer_and_their_drift_is_measured():
    seen = compare(parse_answer(reply([5, 7, 9], [-0.1, -0.72, -0.2], [{5: -0.1}, {7: -0.72}, {9: -0.2}])),
                   RECOMPUTED, 0.01)
    assert seen.same and not seen.differs and seen.drift_nats == pytest.approx(0.02)


def test_a_parting_at_a_near_tie_is_not_a_difference_and_one_beyond_the_tolerance_is():
    tie = parse_answer(reply([5, 8, 3], [-0.1, -0.7, -1.0], [{5: -0.1}, {8: -0.7}, {3: -1.0}]))
    seen = compare(tie, RECOMPUTED, 0.01)
    assert (seen.same, seen.near_tie, seen.differs, seen.first_difference) == (False, True, False, 1)
    assert seen.gap_nats == pytest.approx(0.005)
    assert compare(tie, RECOMPUTED, 0.001).differs  # the same parting, a tighter tolerance
    wrong = parse_answer(reply([6, 7, 9], [-3.0, -0.7, -0.2], [{6: -3.0}, {7: -0.7}, {9: -0.2}]))
    seen = compare(wrong, RECOMPUTED, 0.01)
    assert seen.differs and seen.first_difference == 0 and seen.gap_nats == pytest.approx(2.9)
    assert seen.tokens == {"reloaded": [6, 7, 9], "recomputed": [5, 7, 9]}


def test_without_logprobs_the_comparison_is_exact():
    plain = parse_answer(json.dumps({"choices": [{"text": "", "token_ids": [5, 8, 9]}]}).encode())
    assert plain.chosen is None and compare(plain, RECOMPUTED, 10.0).differs
    assert compare(parse_answer(json.dumps({"choices": [{"text": "a b"}]}).encode()),
                   parse_answer(json.dumps({"choices": [{"text": "a b"}]}).encode()), 0.0).same


@pytest.mark.parametrize(("args", "words"), [
    (["--prompts", "0"], "prompts must be a whole number >= 1"),
    (["--tolerance-nats", "nan"], "tolerance must be a number of nats >= 0"),
    (["--flush-tokens", "-1"], "flush tokens must be a whole number >= 0"),
    ([], "cannot reach http://127.0.0.1:9/v1/models"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, tmp_path):
    done = subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", "verify", "run", "--endpoint",
                           "http://127.0.0.1:9", "-o", str(tmp_path / "v.json"), *args], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


H200_512 = Path(__file__).resolve().parents[2] / "bench/vllm-0.34/results/verify-spillway-b-0.json"


def test_report_judges_a_stored_result_again_at_another_tolerance(tmp_path):
    """The H200's 512-token run: 11 answers parted at 1-3 bf16 logit units at the default tolerance; judged
    again at 0.125 nats none differs, and a tolerance below a unit brings them back."""
    def report(*extra):
        return subprocess.run([sys.executable, "-m", "spillway.cli", "loadtest", "verify", "report", str(H200_512),
                               *extra], capture_output=True, text=True, timeout=60, check=False)

    stored = json.loads(H200_512.read_text())
    assert stored["summary"]["differing"] == 11
    wide = rejudge(stored, 0.125)
    assert wide["summary"]["differing"] == 0 and wide["summary"]["near_ties"] == 13
    assert wide["summary"]["same"] == stored["summary"]["same"] and wide["plan"]["tolerance_nats"] == 0.125
    assert rejudge(stored, 0.05)["summary"]["differing"] == 4  # the partings at 2 and 3 units (0.0625, 0.094)
    assert " 16     3         13          0" in report("--tolerance-nats", "0.125").stdout
    assert " 16     3          2         11" in report().stdout
    bad = report("--tolerance-nats", "-1")
    assert bad.returncode == 2 and "tolerance must be a number of nats >= 0" in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
