"""notebooks/quickstart.ipynb executed top to bottom in a real kernel (nbclient), its
outputs checked: text came out, the repeated prefix was cached, the tree was drawn, and
the constrained answer validates against the schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"
SCHEMA = {"type": "object", "required": ["name", "capital", "continent"],
          "additionalProperties": False, "properties": {
              "name": {"type": "string"}, "capital": {"type": "string"},
              "continent": {"enum": ["Africa", "America", "Asia", "Europe", "Oceania"]}}}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def executed() -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # raises CellExecutionError (with the cell and traceback) if any cell fails
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return nb


def stdout(nb: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs if o.output_type == "stream" and o.name == "stdout")


def test_generates_and_streams(executed):
    out = stdout(executed)
    assert re.search(r"prompt_tokens: \d+ completion_tokens: 12", out)
    streamed = re.search(r"^streamed: (.+)$", out, re.M)
    assert streamed and streamed.group(1).strip()


def test_repeated_prefix_is_cached(executed):
    hits = [int(n) for n in re.findall(r"cached_tokens=(\d+)", stdout(executed))]
    prompts = [int(n) for n in re.findall(r"prompt_tokens=(\d+)", stdout(executed))]
    assert len(hits) == 2
    assert hits[1] > 20 and hits[1] < prompts[1]  # the shared system prompt, not the question


def test_tree_is_rendered_as_text_and_picture(executed):
    out = stdout(executed)
    assert out.count("(root)") == 1 and "├─ [" in out and "└─ [" in out
    nodes = int(re.search(r"nodes: (\d+)", out).group(1))
    assert nodes >= 4  # two plain prompts, the shared chat prefix, two questions
    pngs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs
            if "image/png" in o.get("data", {})]
    assert len(pngs) == 1


def test_constrained_json_validates(executed):
    line = re.search(r"^json: (.+)$", stdout(executed), re.M).group(1)
    jsonschema.validate(json.loads(line), SCHEMA)


def test_frontend_language_cell(executed):
    out = stdout(executed)
    answers = re.findall(r"^lang answer: (.+)$", out, re.M)
    assert len(answers) == 3 and all(a.strip() for a in answers)
    assert "lang select:  Rome" in out
