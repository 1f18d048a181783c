"""docs/api.md's samples are what its curl commands print against the API served for real (the
story in tests/support/api_samples.py, `make api-samples`): a sample edited by hand, or an
answer whose shape changed, fails here until `make api-samples` is run."""

from __future__ import annotations

import difflib

import pytest

from support.api_samples import PAGE, SAMPLES, record
from support.binaries import require
from support.doc_samples import blocks, expected, mask

pytestmark = pytest.mark.timeout(300)


def test_every_sample_is_what_its_command_prints_now() -> None:
    require("curl", "curl")
    require("jq", "jq")
    recorded = record()
    marked = list(blocks(PAGE))
    shown = [name for block in marked for name in block.names]
    assert sorted(shown) == sorted(s.name for s in SAMPLES), "every sample is shown, once"
    for block in marked:
        page, now = mask(block.text), mask(expected(block, recorded))
        diff = "\n".join(difflib.unified_diff(page.split("\n"), now.split("\n"), lineterm=""))
        assert page == now, f"{block.where} differs (run `make api-samples` if right):\n{diff}"
