"""The publishing workflow, .github/workflows/book.yml, checked offline: against GitHub's own
workflow schema (check-jsonschema's vendored copy) and by zizmor's static analysis (a linter
for GitHub Actions: pinned actions, credentials, permissions)."""
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"
BIN = Path(sys.executable).parent


def run(*cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)


def test_the_workflow_matches_githubs_schema():
    p = run(BIN / "check-jsonschema", "--builtin-schema", "vendor.github-workflows", WORKFLOW)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_workflow_has_no_zizmor_findings():
    p = run(BIN / "zizmor", "--offline", WORKFLOW)
    assert p.returncode == 0 and "No findings" in p.stdout + p.stderr, p.stdout + p.stderr


def test_the_workflow_builds_with_the_readme_command_and_deploys_the_html():
    w = yaml.safe_load(WORKFLOW.read_text())
    triggers = w[True] if True in w else w["on"]             # YAML 1.1 reads `on` as True
    assert triggers["push"]["branches"] == ["main"]
    build = "\n".join(s.get("run", "") for s in w["jobs"]["build"]["steps"])
    assert "make book" in build
    upload = next(s for s in w["jobs"]["build"]["steps"]
                  if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html"
    deploy = w["jobs"]["deploy"]
    assert deploy["needs"] == "build" and deploy["permissions"] == {"pages": "write",
                                                                    "id-token": "write"}
