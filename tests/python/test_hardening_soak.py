"""A bounded soak (issue #20) on the toy model: 2,000 mixed requests (grammars, n > 1, invalid
requests, streams cancelled early) from two client threads through one LLM; none lost or
answered twice, ids unique, every valid one equal to its run alone, the engine empty at the end.
The 10,000-request soak on the bundled model (tools/soak.py) is out of the per-commit run."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import soak  # noqa: E402


def test_soak_on_the_toy_model():
    args = soak.parser().parse_args(["--model", "builtin:toy", "--requests", "2000", "--distinct", "120",
                                     "--max-tokens", "24"])
    res = soak.Soak(args).run()
    assert soak.failures(res) == 0, res["problems"][:5]
    assert res["sent"] == 2000 and res["requests"] + res["cancelled"] >= 1900
    assert res["completed"] > 1000 and res["invalid"] > 50 and res["cancelled"] > 0
    assert res["seeded_divergences"] == 0  # the toy model's rows do not depend on the batch
