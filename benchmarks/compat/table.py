"""The results table of ``make compat`` (``benchmarks/compat/results/*.json``, one per nox session)
as Markdown: ``python benchmarks/compat/table.py``."""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ["newest", "default", "gpu-image", "colab-floor", "transformers-floor", "torch-2.6"]


def rows() -> list[str]:
    out = ["| combination | torch / transformers / numpy | task runs (on tiny) | refused in one line | "
           "grader (solution) | test slice | run |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    files = sorted((HERE / "results").glob("*.json"), key=lambda p: ORDER.index(p.stem) if p.stem in ORDER else 99)
    for path in files:
        r = json.loads(path.read_text())
        steps = r["steps"]
        runs = [s for s in steps if not s["step"].startswith(("autograder", "tests"))]
        ok = sum(s["outcome"] == "pass" for s in runs)
        refused = [s["step"].split(" (")[0] for s in runs if s["outcome"] == "refused"]
        failed = [s["step"] for s in steps if s["outcome"].startswith("FAIL")]
        grade = next((s for s in steps if s["step"].startswith("autograder")), {})
        tests = next((s for s in steps if s["step"].startswith("tests")), {})
        g = grade.get("outcome", "-")
        if "required" in grade:  # counted by verdict.py: a check is lost when it did not pass
            g = (f"required {grade['required']}, extra credit {grade['extra_credit']}"
                 + (f"; lost: {'; '.join(grade['lost'])}" if grade.get("lost") else "; nothing lost"))
        elif "score" in grade:  # an older record: it listed as lost only required checks (score < max_score)
            g = (f"{grade['score'].split('/')[0]} pts (old count: lost extra credit not listed)"
                 + (f"; lost: {'; '.join(grade['lost'])}" if grade.get("lost") else ""))
        got = r["got"]
        out.append(f"| {r['combination']} | {got['torch']} / {got['transformers']} / {got['numpy']} | "
                   f"{ok}/{len(runs)} pass" + (f"; FAIL: {', '.join(failed)}" if failed else "") + " | "
                   f"{', '.join(refused) or '-'} | {g} | {tests.get('outcome', '-')} ({tests.get('last_line', '')}) | "
                   f"{r['run_s']:.0f} s |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
