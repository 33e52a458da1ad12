"""A tiny conditioning model repository, made by diffusers itself.

One FLUX.1-dev-like transformer (guidance embedder, pooled CLIP input), fp32,
with random weights from a fixed seed, saved with `save_pretrained` into
<repository>/<name>: what `temb-server --model_repository` serves and
`temb condition --model_dir` reads.  fp32 so that KServe REST may answer in
JSON.  Also writes perf_analyzer's --input-data for it, the CLI's inputs
(pooled.npy, timesteps.txt), and compares a server's KServe answers with a
`temb condition --out` file byte for byte:

    python tests/pylib/tiny_conditioning.py make REPOSITORY [--name NAME]
        [--input_data FILE] [--rows N] [--cli_inputs DIR]
    python tests/pylib/tiny_conditioning.py compare --reference FILE
        [--grpc HOST:PORT] [--http HOST:PORT] [--name NAME]

Used by the deployment tests, scripts/container-smoke.sh and the
perf_analyzer benchmark (bench/triton/conditioning_perf.py).
"""
import argparse
import json
import pathlib
import struct
import sys

NAME = "flux-tiny"
# D = 4 x 64: big enough that every modulation Linear sums 256 terms.
HEADS, HEAD_DIM, POOLED = 4, 64, 768
GUIDANCE = 3.5
TIMESTEPS = [1000.0, 750.0, 500.25, 41.7, 1.0]


def pooled_row(index):
    """A deterministic pooled CLIP row in [-1, 1): no numpy RNG needed."""
    return [((index * 7919 + j * 104729) % 2000) / 1000.0 - 1.0
            for j in range(POOLED)]


def save_model(repository, name=NAME):
    """Saves the model into repository/name; returns that folder."""
    import diffusers  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=2, num_single_layers=2,
        attention_head_dim=HEAD_DIM, num_attention_heads=HEADS,
        joint_attention_dim=24, pooled_projection_dim=POOLED,
        guidance_embeds=True, axes_dims_rope=(16, 24, 24))
    folder = pathlib.Path(repository) / name
    model.to(torch.float32).eval().save_pretrained(folder)
    return folder


def input_data(rows=None):
    """perf_analyzer's --input-data: one entry per request row (default:
    one per timestep), cycling through real denoising timesteps, one
    guidance scale, a pooled row."""
    if rows is None:
        rows = len(TIMESTEPS)
    return {"data": [{"timesteps": [TIMESTEPS[i % len(TIMESTEPS)]],
                      "guidance": [GUIDANCE],
                      "pooled_projections": pooled_row(i)}
                     for i in range(rows)]}


def write_cli_inputs(directory):
    """pooled.npy ([N, 768] float32) and timesteps.txt for `temb condition
    --pooled=... --timesteps=@...`, the rows compare() asks the server."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / "pooled.npy", pooled())
    (directory / "timesteps.txt").write_text(
        ",".join(repr(t) for t in TIMESTEPS) + "\n")


def pooled():
    import numpy as np  # pylint: disable=import-outside-toplevel
    return np.asarray([pooled_row(i) for i in range(len(TIMESTEPS))],
                      dtype=np.float32)


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file."""
    raw = pathlib.Path(path).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    return {name: (entry["dtype"], entry["shape"],
                   data[entry["data_offsets"][0]:entry["data_offsets"][1]])
            for name, entry in header.items() if name != "__metadata__"}


def _inputs(module):
    import numpy as np  # pylint: disable=import-outside-toplevel
    values = {"timesteps": np.asarray(TIMESTEPS, dtype=np.float32),
              "guidance": np.full(len(TIMESTEPS), GUIDANCE, dtype=np.float32),
              "pooled_projections": pooled()}
    inputs = []
    for name, array in values.items():
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def infer_grpc(target, name=NAME):
    """{output: array} from KServe v2 gRPC (tritonclient)."""
    import tritonclient.grpc as triton  # pylint: disable=import-outside-toplevel
    client = triton.InferenceServerClient(target)
    result = client.infer(name, _inputs(triton), client_timeout=60)
    return {o.name: result.as_numpy(o.name)
            for o in result.get_response().outputs}


def infer_http(target, name=NAME):
    """{output: array} from KServe v2 REST (tritonclient.http, binary)."""
    import tritonclient.http as triton  # pylint: disable=import-outside-toplevel
    client = triton.InferenceServerClient(target, network_timeout=60)
    result = client.infer(name, _inputs(triton))
    return {o["name"]: result.as_numpy(o["name"])
            for o in result.get_response()["outputs"]}


def differences(reference, answer):
    """What differs between a `temb condition --out` file's tensors and a
    server's answer ({output: array}); empty when every byte is equal."""
    problems = []
    if set(reference) != set(answer):
        problems.append(f"outputs {sorted(answer)} != {sorted(reference)}")
    for name in sorted(set(reference) & set(answer)):
        dtype, shape, raw = reference[name]
        array = answer[name]
        if dtype != "F32" or list(array.shape) != shape:
            problems.append(f"{name}: {array.dtype}{list(array.shape)} "
                            f"!= {dtype}{shape}")
        elif array.astype("<f4").tobytes() != raw:
            problems.append(f"{name}: bytes differ")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make", help="write the model repository")
    make.add_argument("repository", type=pathlib.Path)
    make.add_argument("--name", default=NAME)
    make.add_argument("--input_data", type=pathlib.Path,
                      help="also write perf_analyzer's input data here")
    make.add_argument("--rows", type=int, default=len(TIMESTEPS))
    make.add_argument("--cli_inputs", type=pathlib.Path,
                      help="also write pooled.npy and timesteps.txt here")
    compare = commands.add_parser(
        "compare", help="a server's answers against `temb condition --out`")
    compare.add_argument("--reference", type=pathlib.Path, required=True)
    compare.add_argument("--grpc")
    compare.add_argument("--http")
    compare.add_argument("--name", default=NAME)
    args = parser.parse_args()
    if args.command == "make":
        args.repository.mkdir(parents=True, exist_ok=True)
        print(save_model(args.repository, args.name))
        if args.input_data:
            args.input_data.write_text(json.dumps(input_data(args.rows)))
            print(args.input_data)
        if args.cli_inputs:
            write_cli_inputs(args.cli_inputs)
            print(args.cli_inputs)
        return 0
    reference = read_safetensors(args.reference)
    failed = False
    for protocol, target, infer in (("gRPC", args.grpc, infer_grpc),
                                    ("REST", args.http, infer_http)):
        if not target:
            continue
        problems = differences(reference, infer(target, args.name))
        sizes = sum(len(raw) for _, _, raw in reference.values())
        print(f"{protocol} {target}: "
              + ("; ".join(problems) if problems
                 else f"{len(reference)} outputs, {sizes} bytes equal"))
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
