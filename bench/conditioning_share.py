#!/usr/bin/env python3
"""The bf16 bytes a family's offload releases at its released (or default)
config, counted on the meta device: each class built by diffusers with no
weights, its parameters summed over the modules the served description names
(the time embedder, every block's modulation Linear, the output norm's).

    .venv/bin/python bench/conditioning_share.py

docs/offload.md's rows for the families counted after the old table mode
went away come from this script.
"""
import re

import diffusers
import torch

FLUX = (r"transformer_blocks\.\d+\.norm1(_context)?\.linear"
        r"|single_transformer_blocks\.\d+\.norm\.linear|norm_out\.linear")
# class -> (constructor arguments, the replaced modules' parameter names)
FAMILIES = {
    "HunyuanVideoFramepackTransformer3DModel": (
        dict(has_image_proj=True, has_clean_x_embedder=True),
        r"^(time_text_embed\.|" + FLUX + ")"),
    "MotifVideoTransformer3DModel": ({}, r"^(time_text_embed\.|" + FLUX + ")"),
    "BriaFiboTransformer2DModel": ({}, r"^(time_embed\.|" + FLUX + ")"),
    "BriaTransformer2DModel": ({}, r"^(time_embed\.|" + FLUX + ")"),
    "LongCatImageTransformer2DModel": ({}, r"^(time_embed\.|" + FLUX + ")"),
    "OvisImageTransformer2DModel": ({}, r"^(timestep_embedder\.|" + FLUX + ")"),
    "HunyuanImageTransformer2DModel": (
        {}, r"^(time_guidance_embed\.|" + FLUX + ")"),
    "AuraFlowTransformer2DModel": (
        {}, r"^(time_step_proj\.|joint_transformer_blocks\.\d+\.norm1"
            r"(_context)?\.linear|single_transformer_blocks\.\d+\.norm1\."
            r"linear|norm_out\.linear)"),
    "CogView4Transformer2DModel": (
        {}, r"^(time_condition_embed\.|transformer_blocks\.\d+\.norm1\."
            r"linear|norm_out\.linear)"),
}

for name, (arguments, replaced) in FAMILIES.items():
    with torch.device("meta"):
        model = getattr(diffusers, name)(**arguments)
    total = sum(p.numel() for p in model.parameters())
    freed = sum(p.numel() for n, p in model.named_parameters()
                if re.match(replaced, n))
    width = model.config.num_attention_heads * model.config.attention_head_dim
    print(f"{name}: D {width}, {total / 1e9:.3f} B parameters, "
          f"{freed / 1e6:.1f} M released, {freed * 2 / 2**30:.2f} GiB bf16, "
          f"{100 * freed / total:.1f}%")
