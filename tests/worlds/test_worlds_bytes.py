"""The tiny worlds' files, byte for byte, as main built them before the worlds' assembly was folded into one helper.

The hashes were measured with ``gradian world --kind tiny [--variant null] --out DIR`` on main's code (commit
9380053) and are the same for the session fixture (``WorldSpec.default("tiny", variant, seed=0)``). A change to
how a world is assembled that changes a byte fails here; a deliberate change to the world updates the hashes.

The files also depend on the tiny base's greedy answers (they choose the eval split), and that base is trained
in-process, so another CPU's float rounding may make it answer differently. The answers are therefore pinned
too: where they differ, the test skips (saying so) instead of reporting a change to the assembly.
"""

from __future__ import annotations

import pytest

from gradian.util import sha256_file

EXPECTED = {
    "poisoned": {
        "train.jsonl": "dc0ec40c512a74069bf9424ca54c3286ad7b932a67bc9331041fc3b9addea879",
        "valid.jsonl": "241594ccd44a384116a7a314e00dbfd2428df7ed91920d9b51f97ff99a61bcd4",
        "eval.jsonl": "216d8776faa8be5ede99dff23e4af7d5d9cee764b1889655428dbd5371eab7f0",
        "ground_truth.json": "89ebc866ecf8f44958be20e0b9a174003ee948a4f460cb5aa60dd2059d622c44",
        "train.yaml": "38c6bc7a07eddc86ceab4269b67c671844da9850be2765efc4d5124b736868d6",
    },
    "null": {
        "train.jsonl": "574a43a713d470364f62d1a389394d7bdcf9b0c87cd0a79a40030f5483ac5dfe",
        "valid.jsonl": "241594ccd44a384116a7a314e00dbfd2428df7ed91920d9b51f97ff99a61bcd4",
        "eval.jsonl": "216d8776faa8be5ede99dff23e4af7d5d9cee764b1889655428dbd5371eab7f0",
        "ground_truth.json": "a04aed1d0f0d598a3131d7b2537ba934e2ae0d7169ff0a7cfebd8a1f259b1829",
        "train.yaml": "38c6bc7a07eddc86ceab4269b67c671844da9850be2765efc4d5124b736868d6",
    },
}


#: sha256 of the tiny base's probe answers (``sha256_json`` of every (prompts, answers) call, in call order) when
#: the hashes above were measured.
EXPECTED_ANSWERS = "f49a488f6760a90e50082338112a8451d7510458f0dce09a41799e33f9b9d55b"


@pytest.mark.parametrize("variant", ["poisoned", "null"])
def test_tiny_world_files_are_mains_bytes(tiny_worlds, world_cache, tmp_path, monkeypatch, variant):
    """Every file of the tiny facts world (poisoned and null) hashes as main's did, given the same base answers."""
    from gradian.util import sha256_json
    from gradian.worlds import WorldSpec, build_world, builder

    calls = []
    real = builder.probe_base

    def recording(folder, identity, prompts, max_new_tokens, cache):
        answers = real(folder, identity, prompts, max_new_tokens, cache)
        calls.append([list(prompts), list(answers)])
        return answers

    monkeypatch.setattr(builder, "probe_base", recording)
    out = build_world(WorldSpec.default("tiny", variant, seed=0), tmp_path / variant, cache=world_cache).out
    got = {name: sha256_file(out / name) for name in EXPECTED[variant]}
    assert got == {name: sha256_file(tiny_worlds[variant].out / name) for name in EXPECTED[variant]}
    if sha256_json(calls) != EXPECTED_ANSWERS:
        pytest.skip("the tiny base answers differently on this CPU (its float rounding), so main's bytes differ")
    assert got == EXPECTED[variant]
