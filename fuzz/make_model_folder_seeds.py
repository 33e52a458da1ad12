#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_model_folder into corpus/model_folder/.

The byte layout is the one model_folder_fuzzer.cc documents: files, each a
tag byte, a little-endian uint32 length and the bytes.  The seeds are tiny
models the loader accepts (Qwen-Image with D = 8, in a single file, in an
index and a shard, stored bf16, loaded bf16 by temb.json), and a few it must
refuse.  Only the tensors the conditioning model reads are written; their
values come from a fixed formula, so nothing here needs numpy or torch.
Run it after changing the layout:
    python3 fuzz/make_model_folder_seeds.py
"""
import json
import pathlib
import struct

CONFIG, SINGLE, INDEX, SHARD, OPTIONS = range(5)
D, LAYERS = 8, 1


def file(tag, data):
    if isinstance(data, str):
        data = data.encode()
    return struct.pack("<BI", tag, len(data)) + data


def bf16(value):
    return struct.pack("<f", value)[2:]


def safetensors(tensors, dtype="F32"):
    """A safetensors file of {name: shape}, values k / 1000 - 0.5."""
    header, blobs, offset = {}, [], 0
    for name, shape in tensors.items():
        count = 1
        for extent in shape:
            count *= extent
        values = [((k * 37) % 1000) / 1000.0 - 0.5 for k in range(count)]
        blob = (b"".join(bf16(v) for v in values) if dtype == "BF16"
                else struct.pack(f"<{count}f", *values))
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def qwen_tensors():
    tensors = {}
    embedder = "time_text_embed.timestep_embedder"
    tensors[f"{embedder}.linear_1.weight"] = (D, 256)
    tensors[f"{embedder}.linear_1.bias"] = (D,)
    tensors[f"{embedder}.linear_2.weight"] = (D, D)
    tensors[f"{embedder}.linear_2.bias"] = (D,)
    for i in range(LAYERS):
        for stream in ("img", "txt"):
            tensors[f"transformer_blocks.{i}.{stream}_mod.1.weight"] = (6 * D,
                                                                       D)
            tensors[f"transformer_blocks.{i}.{stream}_mod.1.bias"] = (6 * D,)
    tensors["norm_out.linear.weight"] = (2 * D, D)
    tensors["norm_out.linear.bias"] = (2 * D,)
    return tensors


QWEN_CONFIG = json.dumps({
    "_class_name": "QwenImageTransformer2DModel", "num_layers": LAYERS,
    "num_attention_heads": 1, "attention_head_dim": D,
    "guidance_embeds": False})


def seeds():
    tensors = qwen_tensors()
    single = safetensors(tensors)
    index = json.dumps({"metadata": {},
                        "weight_map": {name: "model-00001.safetensors"
                                       for name in tensors}})
    yield "qwen_single", file(CONFIG, QWEN_CONFIG) + file(SINGLE, single)
    yield "qwen_sharded", (file(CONFIG, QWEN_CONFIG) + file(INDEX, index)
                           + file(SHARD, single))
    yield "qwen_bf16_stored", (file(CONFIG, QWEN_CONFIG)
                               + file(SINGLE, safetensors(tensors, "BF16")))
    yield "qwen_loaded_bf16", (file(CONFIG, QWEN_CONFIG) + file(SINGLE, single)
                               + file(OPTIONS, '{"torch_dtype": "bfloat16"}'))
    deep = json.loads(QWEN_CONFIG)
    deep["num_layers"] = 1000000000
    yield "block_count_past_the_tensors", (file(CONFIG, json.dumps(deep))
                                           + file(SINGLE, single))
    yield "unknown_class", (file(CONFIG, '{"_class_name": "Nope"}')
                            + file(SINGLE, single))
    yield "no_weights", file(CONFIG, QWEN_CONFIG)


def main():
    out = pathlib.Path(__file__).resolve().parent / "corpus" / "model_folder"
    out.mkdir(parents=True, exist_ok=True)
    for name, data in seeds():
        (out / f"{name}.bin").write_bytes(data)
        print(f"{name}.bin: {len(data)} bytes")


if __name__ == "__main__":
    main()
