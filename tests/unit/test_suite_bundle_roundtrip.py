"""A suite bundle saved and loaded keeps its steps and its expectation outcomes (real H200 results)."""

from pathlib import Path

from gpubench.validation import suite
from gpubench.core.result import load

DATA = Path(__file__).resolve().parent.parent / "data"
EXPECT = Path(__file__).resolve().parents[2] / "src" / "gpubench" / "profiles" / "h200x2.toml"


def test_bundle_round_trip_keeps_outcomes(tmp_path):
    results = [load(DATA / n) for n in ("p2p-h200x2.json", "nccl-h200x2.json", "batch-h200.json")]
    exps = [e for e in suite.load_expectations(EXPECT) if e.command in ("p2p", "nccl", "batch")]
    outcomes = suite.evaluate(exps, results)
    assert [o.status for o in outcomes] == ["pass"] * len(exps)
    b = suite.Bundle(steps=[suite.Step(r.command, r.command, "ok", result=r) for r in results],
                     expect_file=str(EXPECT), outcomes=list(outcomes))
    back = suite.load_checkable(suite.save_bundle(b, tmp_path / "bundle.json"))
    assert [o.status for o in back.outcomes] == [o.status for o in outcomes]
    assert [o.value for o in back.outcomes] == [o.value for o in outcomes]
    assert back.outcomes[0].expectation == outcomes[0].expectation
    assert back.to_dict()["steps"] == b.to_dict()["steps"]
