"""Every served output's bytes, for every family and variant, against a
record taken before the conditioning models were restructured.

The tiny models are the parity suite's own (diffusers builds them from fixed
seeds and saves them), asked for through `temb condition` with the parity
suite's inputs: each fp32 and bf16 folder as stored, and each fp32 folder
loaded as bf16 (`--torch_dtype=bf16`, as from_pretrained(torch_dtype=...)
converts it).  Each output's SHA-256, shape and dtype must equal the record
in recorded_bytes.json: a change to the loader, the evaluator or a family's
description that moves one bit of one output fails here, naming it.

TEMB_RECORD_BYTES=1 writes the record instead (only when the computation is
meant to change, with the reason in the commit).  The record is of the CPU
engine; on another device the test skips.
"""

import hashlib
import json
import os
import pathlib

import pytest

torch = pytest.importorskip("torch")

import test_conditioning_parity as parity  # noqa: E402

RECORD = pathlib.Path(__file__).with_name("recorded_bytes.json")
RECORDING = os.environ.get("TEMB_RECORD_BYTES") == "1"
CASES = [(kind, "fp32", ()) for kind in parity.FP32_KINDS] + \
    [(kind, "bf16", ()) for kind in parity.KINDS] + \
    [(kind, "fp32", ("--torch_dtype=bf16",)) for kind in parity.FP32_KINDS]


def case_name(kind, dtype, flags):
    return "/".join([kind, dtype, *flags])


def digest(tensor):
    data = tensor.contiguous().view(torch.uint8).numpy().tobytes()
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype),
            "sha256": hashlib.sha256(data).hexdigest()}


@pytest.fixture(scope="module")
def answers(saved, temb_cli, tmp_path_factory):
    if parity.DEVICE != "cpu":
        pytest.skip("the record is of the CPU engine")
    found = {}
    for kind, dtype, flags in CASES:
        _, folder, pooled = saved[(kind, dtype)]
        if flags:
            pooled = pooled.to(torch.bfloat16).float()
        tmp = tmp_path_factory.mktemp("bytes")
        outputs = parity.temb_outputs(temb_cli, kind, folder, pooled, tmp,
                                      flags=flags)
        found[case_name(kind, dtype, flags)] = {
            name: digest(value) for name, value in sorted(outputs.items())}
    if RECORDING:
        RECORD.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    return found


saved = parity.saved


def test_the_record_covers_every_case():
    record = json.loads(RECORD.read_text())
    assert sorted(record) == sorted(case_name(*case) for case in CASES)
    assert len({kind for kind, _, _ in CASES}) == len(parity.KINDS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: case_name(*c))
def test_served_bytes_equal_the_record(case, answers):
    record = json.loads(RECORD.read_text())[case_name(*case)]
    got = answers[case_name(*case)]
    assert sorted(got) == sorted(record), "the outputs served changed"
    for name, expected in record.items():
        assert got[name] == expected, f"{name} of {case_name(*case)}"
