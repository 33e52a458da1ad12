"""temb's time conditioning against diffusers' own forward pass.

For each family, tiny random models are built and saved by diffusers itself
(save_pretrained; one of them sharded, so the index.json path is read), in
float32 and bfloat16.  The model's own forward runs the way its pipeline
calls it (timestep = t.to(dtype) / 1000, or for SD3 the float32 t as it
is; guidance a float32 tensor; pooled embeddings in the model's dtype)
with forward hooks capturing every conditioning output: the
time_text_embed result (temb), each block's modulation Linear,
norm_out.linear.  `temb condition` then computes the same outputs from the
saved folder alone, and the two are compared:

  * bf16: within one bf16 ulp everywhere (a Linear summed in another order
    than PyTorch's GEMM rounds the other way now and then); how many
    elements differ at all is recorded.  Where a sum cancels (an output near
    zero after Linear -> SiLU -> Linear), one ulp of an input moves the
    output by more than one ulp of itself; such an element passes when
    PyTorch itself moves at least as far under a second summation order,
    measured here three ways: the same model with every Linear summed in
    float64, or in float32 (sgemm), and rounded once; and the same model run
    on one row at a time (PyTorch's bf16 GEMM rounds differently with the
    row count).  Failing those, an element passes when its gap is within the
    float32 summation bound of the Linear computing it (fed diffusers' own
    input): the three orders can happen to round as PyTorch's GEMM does
    where two float32 orders of a cancelling sum differ (docs/conditioning.md
    gives the HunyuanVideo-1.5 evidence).  Failing that too, it passes only
    when every op holds its rule fed temb's own inputs (the op-by-op check
    below): the gap is then summation orders' rounding carried along a
    chain of Linears, which an engine summing in an order unlike all of
    those above shows (the GPU's, scripts/gpu-check.sh); counted apart.
  * bf16, op by op: every op of temb's description, fed temb's own inputs
    to it, against the diffusers module that computes it: the rounded
    timesteps, casts, SiLU and adds bit for bit, the sinusoid within one
    ulp, Linears within one ulp or, where the sum cancels, within the
    float32 summation error bound of two orders.  This pins the exceptions
    above on summation order alone.
  * fp32: temb's largest error against a float64 evaluation of the same
    weights is at most twice PyTorch's own.  The float64 evaluation is the
    same diffusers model in float64 whose time_proj is given the exact
    timesteps the float32 model embedded (with a float64 sinusoid).

A float32 folder as a bf16 pipeline loads it: diffusers'
from_pretrained(folder, torch_dtype=torch.bfloat16) (Wan, whose kept
modules stay float32; Qwen-Image, which keeps none) against
`temb condition --torch_dtype=bf16` on the same folder, under the bf16
rules above; temb.json in the folder gives the flag's bits, and the flag
overrides it.

Through the CLI as well: each row computed alone equals the same row
computed in a batch, bit for bit; repeated calls in one process hit the row
cache and return the uncached bits; bad requests are refused naming their
cause.
"""

import copy
import importlib.util
import itertools
import json
import math
import os
import subprocess
import tempfile
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
safetensors_torch = pytest.importorskip("safetensors.torch")

# Scheduler timesteps as FlowMatch produces them (fractional), the ends and
# a repeat (the repeat is computed once).
TIMESTEPS = [1000.0, 992.3125, 871.5, 500.25, 333.0, 41.7, 1.0, 0.0, 500.25]
GUIDANCE = 3.5
TEXT_TOKENS = 6
# D = 256 (4 heads of 64): sums long enough (256 and 768 terms into the
# embedders, 256 into every modulation Linear) for summation order to show.
WIDTH = 256
ROPE = (16, 24, 24)
POOLED = 768


def qwen_model(dtype, zero_cond_t=False):
    """Qwen-Image, or with zero_cond_t Qwen-Image-Edit-2511's variant: the
    model stacks the rows of t and of t * 0, and the reference image's
    tokens read the second half of img_mod."""
    torch.manual_seed(5 if zero_cond_t else 0)
    model = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=3,
        attention_head_dim=WIDTH // 4, num_attention_heads=4,
        joint_attention_dim=24, axes_dims_rope=ROPE, zero_cond_t=zero_cond_t)
    return model.to(dtype).eval()


def flux_model(dtype, guidance_embeds):
    torch.manual_seed(1 if guidance_embeds else 2)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=2, num_single_layers=3,
        attention_head_dim=WIDTH // 4, num_attention_heads=4,
        joint_attention_dim=24, pooled_projection_dim=POOLED,
        guidance_embeds=guidance_embeds, axes_dims_rope=ROPE)
    return model.to(dtype).eval()


def sd3_model(dtype, dual_attention_layers):
    """SD3 (no dual-attention block) or SD3.5 Medium-like: blocks 0 and 2
    use SD35AdaLayerNormZeroX (9D), so the 9D selection is not contiguous
    and includes the last block, whose context norm is the 2D one."""
    torch.manual_seed(3 if dual_attention_layers else 4)
    model = diffusers.SD3Transformer2DModel(
        sample_size=4, patch_size=2, in_channels=4, out_channels=4,
        num_layers=3, attention_head_dim=WIDTH // 4, num_attention_heads=4,
        joint_attention_dim=24, caption_projection_dim=WIDTH,
        pooled_projection_dim=POOLED, pos_embed_max_size=4,
        dual_attention_layers=dual_attention_layers)
    return model.to(dtype).eval()


def hunyuan_video15_model(dtype):
    """HunyuanVideo-1.5 (one refiner block, whose own time embedding is not
    an output: it reads the prompt)."""
    # Seed 32 has cancelling sums where temb and PyTorch's GEMM round two
    # float32 orders apart (docs/conditioning.md).
    torch.manual_seed(32)
    model = diffusers.HunyuanVideo15Transformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=4,
        attention_head_dim=WIDTH // 4, num_layers=3, num_refiner_layers=1,
        text_embed_dim=24, text_embed_2_dim=24, image_embed_dim=24,
        rope_axes_dim=ROPE)
    return model.to(dtype).eval()


def hunyuan_video15_inputs(dtype, t, generator):
    """The HunyuanVideo-1.5 pipelines' call: t at the 0..1000 scale, in the
    latents' dtype; the two text encoders' states, no image."""
    batch = t.shape[0]
    return dict(
        hidden_states=torch.randn(batch, 4, 1, 2, 2,
                                  generator=generator).to(dtype),
        timestep=t.to(dtype),
        encoder_hidden_states=torch.randn(
            batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
        encoder_attention_mask=torch.ones(batch, TEXT_TOKENS),
        encoder_hidden_states_2=torch.randn(
            batch, 3, 24, generator=generator).to(dtype),
        encoder_attention_mask_2=torch.ones(batch, 3),
        image_embeds=torch.zeros(batch, 2, 24, dtype=dtype))


# SDXL's added time ids per row: original size, crop top-left, target size.
TIME_IDS = [[1024.0, 1024.0, 0.0, 0.0, 1024.0, 1024.0],
            [768.0, 1344.0, 0.0, 0.0, 1024.0, 1024.0],
            [512.0, 512.0, 64.0, 32.0, 896.0, 1152.0],
            [1536.0, 640.0, 128.0, 0.0, 1024.0, 1024.0],
            [1024.0, 1024.0, 0.0, 0.0, 1024.0, 1024.0],
            [333.0, 4096.0, 7.0, 1.0, 1024.0, 768.0],
            [1024.0, 1024.0, 0.0, 0.0, 1024.0, 1024.0],
            [2048.0, 2048.0, 256.0, 256.0, 1024.0, 1024.0],
            [768.0, 1344.0, 0.0, 0.0, 1024.0, 1024.0]]


def sdxl_unet(dtype):
    """SDXL's UNet layout at small widths: three levels of distinct widths
    (time embedding 256 wide), two resnets per down block, three per up
    block; the pooled embedding 768 wide beside the six 256-wide time id
    embeddings."""
    torch.manual_seed(8)
    model = diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(64, 96, 128),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D",
                          "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                        "UpBlock2D"),
        cross_attention_dim=24, attention_head_dim=(2, 3, 4),
        use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=POOLED + 6 * 256)
    return model.to(dtype).eval()


class ResnetTembInput:
    """The emb (time_embedding + add_embedding) a ResnetBlock2D receives,
    captured by a forward hook's interface: diffusers computes it inline in
    the UNet's forward, not in a module of its own."""

    def __init__(self, resnet):
        self.resnet = resnet

    def register_forward_hook(self, hook):
        def pre_hook(module, args, kwargs):
            hook(module, args, kwargs["temb"] if "temb" in kwargs else args[1])
        return self.resnet.register_forward_pre_hook(pre_hook,
                                                      with_kwargs=True)


def flux2_model(dtype, guidance_embeds):
    """FLUX.2 dev (guidance embedder) or klein (none); no Linear has a
    bias."""
    torch.manual_seed(6 if guidance_embeds else 7)
    model = diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=4, num_layers=2, num_single_layers=3,
        attention_head_dim=WIDTH // 4, num_attention_heads=4,
        joint_attention_dim=24, axes_dims_rope=(16, 16, 16, 16),
        guidance_embeds=guidance_embeds)
    return model.to(dtype).eval()


def build(kind, dtype):
    if kind == "sdxl-unet":
        return sdxl_unet(dtype)
    if kind.startswith("flux.2"):
        return flux2_model(dtype, guidance_embeds=(kind == "flux.2-dev"))
    if kind.startswith("qwen-image"):
        return qwen_model(dtype, zero_cond_t=(kind == "qwen-image-edit"))
    if kind == "hunyuanvideo-1.5":
        return hunyuan_video15_model(dtype)
    if kind.startswith("sd3"):
        return sd3_model(dtype, (0, 2) if kind == "sd3.5" else ())
    return flux_model(dtype, guidance_embeds=(kind == "flux.1-dev"))


# The kinds whose model takes a pooled text embedding, and a guidance scale.
POOLED_KINDS = ("flux.1-dev", "flux.1-schnell", "sd3", "sd3.5", "sdxl-unet",
                "hidream-i1", "hunyuanvideo", "hunyuanvideo-i2v",
                "hunyuanvideo-token-replace", "hunyuanvideo-framepack")
GUIDED_KINDS = ("flux.1-dev", "flux.2-dev", "hunyuanvideo", "sana-sprint",
                "hunyuanvideo-token-replace", "hunyuanimage-2.1",
                "hunyuanvideo-framepack")


def time_embedding(kind, model):
    """The module computing temb, whose time_proj embeds the timesteps."""
    if kind == "hunyuanvideo-1.5":
        return model.time_embed
    if kind.startswith("flux.2"):
        return model.time_guidance_embed
    if kind == "sdxl-unet":
        return model  # its time_proj is the UNet's own
    return model.time_text_embed


def conditioning_modules(kind, model):
    """(output name, block index or None, module[, how]) for every
    output."""
    if kind in FAMILIES:
        return FAMILIES[kind].modules(model)
    if kind == "sdxl-unet":
        # Every ResnetBlock2D's time_emb_proj, grouped by block.
        found = [("temb", None,
                  ResnetTembInput(model.down_blocks[0].resnets[0]))]
        groups = [(f"down_blocks.{b}", block)
                  for b, block in enumerate(model.down_blocks)]
        groups += [("mid_block", model.mid_block)]
        groups += [(f"up_blocks.{b}", block)
                   for b, block in enumerate(model.up_blocks)]
        for name, block in groups:
            for j, resnet in enumerate(block.resnets):
                found.append((name, j, resnet.time_emb_proj))
        return found
    if kind == "qwen-image-edit":
        # temb and img_mod have the rows of t, then those of t * 0 (see
        # test_zero_cond_t_reference_rows_are_the_rows_at_zero): the first
        # half is what the timesteps' rows are compared with.
        found = [("temb", None, time_embedding(kind, model), first_half)]
        for i, block in enumerate(model.transformer_blocks):
            found.append(("img_mod", i, block.img_mod[1], first_half))
            found.append(("txt_mod", i, block.txt_mod[1]))
        return found + [("norm_out", None, model.norm_out.linear)]
    found = [("temb", None, time_embedding(kind, model))]
    if kind.startswith("flux.2"):
        # One modulation each, shared by every double (single) block.
        return found + [
            ("img_mod", None, model.double_stream_modulation_img.linear),
            ("txt_mod", None, model.double_stream_modulation_txt.linear),
            ("single_mod", None, model.single_stream_modulation.linear),
            ("norm_out", None, model.norm_out.linear),
        ]
    for i, block in enumerate(model.transformer_blocks):
        if kind.startswith("sd3"):
            # SD35AdaLayerNormZeroX (9D) exactly in the dual blocks.
            wide = type(block.norm1).__name__ == "SD35AdaLayerNormZeroX"
            assert wide == block.use_dual_attention
            found.append(("img_mod_dual" if wide else "img_mod", i,
                          block.norm1.linear))
            if block.context_pre_only:
                found.append(("txt_mod_last", None,
                              block.norm1_context.linear))
            else:
                found.append(("txt_mod", i, block.norm1_context.linear))
        elif kind == "qwen-image":
            found.append(("img_mod", i, block.img_mod[1]))
            found.append(("txt_mod", i, block.txt_mod[1]))
        else:
            found.append(("img_mod", i, block.norm1.linear))
            found.append(("txt_mod", i, block.norm1_context.linear))
    if kind.startswith("flux.1"):
        for i, block in enumerate(model.single_transformer_blocks):
            found.append(("single_mod", i, block.norm.linear))
    found.append(("norm_out", None, model.norm_out.linear))
    return found


def first_half(rows):
    return rows[:rows.shape[0] // 2]


def model_inputs(kind, dtype, pooled):
    """Keyword arguments for the model's forward, as its pipeline makes
    them: the timestep in the latents' dtype divided by 1000, or for SD3
    the scheduler's float32 t as it is."""
    batch = len(TIMESTEPS)
    generator = torch.Generator().manual_seed(7)
    t = torch.tensor(TIMESTEPS, dtype=torch.float32)
    if kind in FAMILIES:
        args = FAMILIES[kind].inputs(dtype, t, generator)
        if kind in POOLED_KINDS:
            # The pipeline's pooled embedding, in the model's dtype.
            args[FAMILIES[kind].pooled_argument] = pooled.to(dtype)
        return args
    if kind == "sdxl-unet":
        # The scheduler's float32 t as it is; the pipeline's pooled
        # embedding and time ids in the model's dtype.
        return dict(
            sample=torch.randn(batch, 4, 8, 8, generator=generator).to(dtype),
            timestep=t,
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            added_cond_kwargs={
                "text_embeds": pooled.to(dtype),
                "time_ids": torch.tensor(TIME_IDS).to(dtype)})
    if kind.startswith("sd3"):
        return dict(
            hidden_states=torch.randn(batch, 4, 4, 4,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            pooled_projections=pooled.to(dtype), timestep=t)
    if kind == "hunyuanvideo-1.5":
        return hunyuan_video15_inputs(dtype, t, generator)
    timestep = t.to(dtype) / 1000
    if kind.startswith("flux.2"):
        args = dict(
            hidden_states=torch.randn(batch, 4, 4,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            timestep=timestep, img_ids=torch.zeros(4, 4),
            txt_ids=torch.zeros(TEXT_TOKENS, 4))
        if kind == "flux.2-dev":
            args["guidance"] = torch.full([batch], GUIDANCE,
                                          dtype=torch.float32)
        return args
    if kind.startswith("qwen-image"):
        # The edit model's sample: the target image's 4 tokens, then a
        # reference image's 4, which read the rows at t * 0.
        images = [(1, 2, 2)] * (2 if kind == "qwen-image-edit" else 1)
        return dict(
            hidden_states=torch.randn(batch, 4 * len(images), 16,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            encoder_hidden_states_mask=torch.ones(batch, TEXT_TOKENS),
            timestep=timestep, img_shapes=[images] * batch)
    args = dict(
        hidden_states=torch.randn(batch, 4, 4, generator=generator).to(dtype),
        encoder_hidden_states=torch.randn(
            batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
        pooled_projections=pooled.to(dtype), timestep=timestep,
        img_ids=torch.zeros(4, 3), txt_ids=torch.zeros(TEXT_TOKENS, 3))
    if kind == "flux.1-dev":
        args["guidance"] = torch.full([batch], GUIDANCE, dtype=torch.float32)
    return args


def run_hooked(model, args, handles, restores=()):
    """model(**args) without gradients, then the hooks removed and the
    patched modules restored, whatever happened."""
    try:
        with torch.no_grad():
            return model(**args)
    finally:
        for handle in handles:
            handle.remove()
        for restore in restores:
            restore()


def capture(kind, model, args, time_proj_override=None,
            sinusoid_overrides=()):
    """Runs the model's own forward; returns {output: [N, (L,) W] tensor}.
    An entry of conditioning_modules may name how to read its module: a
    function of the hook's output, or TABLE for the sums diffusers forms
    with the module's scale_shift_table."""
    captured = {}
    handles = []
    restores = []
    for name, block, module, *how in conditioning_modules(kind, model):
        how = how[0] if how else None

        def keep(value, name=name, block=block):
            captured.setdefault(name, {})[block] = value.detach().clone()

        if how is TABLE:
            # A per-token sum [B, T, k, D] (LTX-Video's) is B * T rows.
            restores.append(record_table_adds(
                module, lambda value, keep=keep: keep(
                    value.flatten(0, 1) if value.dim() == 4 else value)))
            continue
        if isinstance(how, Argument):
            handles.append(module.register_forward_pre_hook(
                lambda _m, _args, kwargs, keep=keep, how=how:
                    keep(kwargs[how.name]), with_kwargs=True))
            continue
        if isinstance(how, NthCall):
            def nth(_module, _inputs, output, keep=keep, how=how,
                    calls=itertools.count()):
                if next(calls) % how.period == how.n:
                    keep(output)
            handles.append(module.register_forward_hook(nth))
            continue

        def hook(_module, _inputs, output, keep=keep, how=how):
            keep(output if how is None else how(output))
        handles.append(module.register_forward_hook(hook))
    if time_proj_override is not None:
        handles.append(
            time_embedding(kind, model).time_proj.register_forward_hook(
                time_proj_override))
    for module, override in sinusoid_overrides:
        handles.append(module.register_forward_hook(override))
    run_hooked(model, args, handles, restores)
    result = {}
    for name, by_block in captured.items():
        if list(by_block) == [None]:
            result[name] = by_block[None]
        else:
            result[name] = torch.stack([by_block[i] for i in sorted(by_block)],
                                       dim=1)
    return result


def time_proj_inputs(kind, model, args):
    """The timesteps (and guidance) the model's time_proj embeds, in order."""
    seen = []
    handle = time_embedding(kind, model).time_proj.register_forward_hook(
        lambda _m, inputs, _o: seen.append(inputs[0].detach().clone()))
    run_hooked(model, args, [handle])
    return seen


def float64_sinusoid(values, scale, dim=256):
    """get_timestep_embedding(dim, flip, shift 0) in float64."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float64)
                      / half)
    angles = scale * values.to(torch.float64)[:, None] * freqs[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def float64_reference(kind, model32, args32):
    """The float32 model's weights evaluated in float64, from the exact
    values its time_proj embedded."""
    if kind in FAMILIES:
        return float64_reference_of(kind, model32, args32)
    embedded = time_proj_inputs(kind, model32, args32)
    scale = 1000.0 if kind.startswith("qwen-image") else 1.0
    model64 = copy.deepcopy(model32).to(torch.float64)
    calls = iter(embedded)

    def override(_module, _inputs, output):
        return float64_sinusoid(next(calls), scale, output.shape[-1])

    def to64(value):
        if isinstance(value, dict):
            return {k: to64(v) for k, v in value.items()}
        return (value.to(torch.float64) if torch.is_tensor(value) and
                value.is_floating_point() else value)

    args64 = {k: to64(v) for k, v in args32.items()}
    handles = []
    if kind == "sdxl-unet":
        # The time ids' embedding too, from the exact ids.
        handles.append(model64.add_time_proj.register_forward_hook(
            lambda _m, inputs, output: float64_sinusoid(
                inputs[0], 1.0, output.shape[-1])))
    try:
        return capture(kind, model64, args64, time_proj_override=override)
    finally:
        for handle in handles:
            handle.remove()


# TEMB_CONDITIONING_DEVICE=cuda runs temb's Linears on the GPU (cuBLASLt)
# in every comparison below: the same rules hold there (scripts/gpu-check.sh).
DEVICE = os.environ.get("TEMB_CONDITIONING_DEVICE", "cpu")


def run_temb(cli, folder, out, timesteps, kind, pooled_file=None,
             outputs=None, time_ids_file=None, flags=(),
             time_flag="timesteps"):
    command = [str(cli), "condition", f"--model_dir={folder}",
               f"--{time_flag}=" + ",".join(repr(t) for t in timesteps),
               f"--out={out}", "--threads=2", f"--device={DEVICE}", *flags]
    extra = {name: ",".join(repr(v) for v in values)
             for name, values in (FAMILIES[kind].extra_inputs(len(timesteps))
                                  if kind in FAMILIES else {}).items()}
    if time_ids_file is not None:
        extra["time_ids"] = f"@{time_ids_file}"
    if extra:
        command.append("--inputs=" + ";".join(
            f"{name}={value}" for name, value in extra.items()))
    if kind in GUIDED_KINDS:
        command.append(f"--guidance={GUIDANCE}")
    if pooled_file is not None:
        command.append(f"--pooled={pooled_file}")
    if outputs:
        command.append("--outputs=" + ",".join(outputs))
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return safetensors_torch.load_file(str(out))


def capture_with_linears_in(dtype, kind, model, args):
    """capture() of a copy of `model` whose every Linear is summed in `dtype`
    (float64, or float32 through sgemm) and rounded once to the model's
    dtype: PyTorch under another summation order than its bf16 GEMM's."""
    other = copy.deepcopy(model)

    def forward(self, x):
        bias = None if self.bias is None else self.bias.to(dtype)
        return torch.nn.functional.linear(x.to(dtype), self.weight.to(dtype),
                                          bias).to(x.dtype)

    for module in other.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = types.MethodType(forward, module)
    return capture(kind, other, args)


def capture_with_linears_reversed(kind, model, args):
    """capture() of a copy of `model` whose every Linear is PyTorch's own,
    in the model's dtype, over the terms in reverse order (input and weight
    flipped along k): the same sum, summed the other way round."""
    other = copy.deepcopy(model)

    def forward(self, x):
        return torch.nn.functional.linear(x.flip(-1), self.weight.flip(-1),
                                          self.bias)

    for module in other.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = types.MethodType(forward, module)
    return capture(kind, other, args)


def capture_row_by_row(kind, model, args):
    """capture() of the model run on one row of the batch at a time."""
    batch = len(TIMESTEPS)
    rows = {}
    family = FAMILIES.get(kind)
    for row in range(batch):
        one = {}
        if family is not None and family.row_args(args, row) is not None:
            one = family.row_args(args, row)
        for key, value in args.items() if not one else ():
            if torch.is_tensor(value) and value.dim() > 0 and \
                    value.shape[0] == batch:
                one[key] = value[row:row + 1]
            elif isinstance(value, list) and len(value) == batch:
                # Qwen-Image's img_shapes, Z-Image's per-sample tensors.
                one[key] = value[row:row + 1]
            elif isinstance(value, dict):  # PixArt's, SDXL's added_cond_kwargs
                one[key] = {k: None if v is None else v[row:row + 1]
                            for k, v in value.items()}
            else:
                one[key] = value
        for name, tensor in capture(kind, model, one).items():
            rows.setdefault(name, []).append(tensor)
    return {name: torch.cat(parts) for name, parts in rows.items()}


def summing_linear(kind, module):
    """The Linear whose sum an output is, or None where the output adds
    several embedders (FLUX's and SD3's temb)."""
    if isinstance(module, torch.nn.Linear):
        return module
    if kind in ("hunyuanvideo-1.5", "flux.2-klein"):
        return module.timestep_embedder.linear_2
    return None


def summation_bounds(kind, model, args):
    """{output: float64 tensor}: for each output that is one Linear's sum,
    2 K 2^-24 sum |x_k w_k| over diffusers' own input x to that Linear, the
    most two float32 summation orders of its K terms can differ by."""
    found = {}
    handles = []
    for name, block, module, *how in conditioning_modules(kind, model):
        # An output read another way than as the module's result (a table
        # sum, an argument, a function of the result) is no Linear's sum.
        linear = None if how else summing_linear(kind, module)
        if linear is None:
            continue

        def hook(mod, inputs, _output, name=name, block=block):
            x = inputs[0].detach().double().abs()
            found.setdefault(name, {})[block] = 2 * x.shape[-1] * 2.0 ** -24 \
                * torch.nn.functional.linear(x, mod.weight.double().abs())
        handles.append(linear.register_forward_hook(hook))
    run_hooked(model, args, handles)
    return {name: by_block[None] if list(by_block) == [None] else
            torch.stack([by_block[i] for i in sorted(by_block)], dim=1)
            for name, by_block in found.items()}


def bf16_ulp_distance(a, b):
    """|a - b| in units of the bf16 grid, element-wise, via the ordered
    integer image of the bit patterns."""
    def ordered(x):
        bits = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -32768 - bits, bits)
    return (ordered(a) - ordered(b)).abs()


# ---------------------------------------------------------------------------
# Families whose conditioning ends in additive tables (Wan, PixArt) or whose
# widths are not D (CogVideoX).  Each is a Family: how diffusers builds and
# saves it, the pipeline's forward arguments, and where its outputs are.

TABLE = object()  # conditioning_modules: the module's scale_shift_table sums
_ADDS = {torch.Tensor.__add__, torch.Tensor.__radd__, torch.Tensor.add,
         torch.add}


class Argument:
    """conditioning_modules: the keyword argument `name` the module is
    called with (CogVideoX's temb, a sum no module returns)."""

    def __init__(self, name):
        self.name = name


class NthCall:
    """conditioning_modules: the module's result at call `n` of every
    `period` (HunyuanVideo-I2V's token_replace blocks call their modulation
    Linear for temb, then for the token_replace embedding)."""

    def __init__(self, n, period=2):
        self.n = n
        self.period = period


class _TableAdds(torch.Tensor):
    """A scale_shift_table that hands each sum diffusers forms with it to a
    sink: the value a block chunks into its shifts, scales and gates.  Its
    views (table[None], table.to(device)) do the same; any other result is
    a plain tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **(kwargs or {}))
        table = next((a for a in args if isinstance(a, _TableAdds)), None)
        if table is None or not isinstance(result, torch.Tensor):
            return result
        if func in _ADDS:
            table._sink(result)
            return result.as_subclass(torch.Tensor)
        view = result.as_subclass(_TableAdds)
        view._sink = table._sink
        return view


def record_table_adds(module, sink):
    """Swaps module.scale_shift_table for a recording view of itself until
    the returned function is called."""
    param = module._parameters.pop("scale_shift_table")
    view = param.detach().as_subclass(_TableAdds)
    view._sink = sink
    module.__dict__["scale_shift_table"] = view

    def restore():
        del module.__dict__["scale_shift_table"]
        module._parameters["scale_shift_table"] = param
    return restore


def float64_timesteps(module, values):
    """diffusers' Timesteps `module` (its width, flip, shift and scale)
    evaluated in float64."""
    half = module.num_channels // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float64)
    exponent = exponent / (half - module.downscale_freq_shift)
    angles = module.scale * values.to(torch.float64)[:, None] * \
        torch.exp(exponent)[None, :]
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if module.flip_sin_to_cos:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    if module.num_channels % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1, 0, 0))
    return emb


def sinusoid_calls(kind, model, args):
    """{module name: [input of each call]} for the family's Timesteps
    modules, in call order."""
    names = FAMILIES[kind].sinusoids
    modules = dict(model.named_modules())
    seen = {name: [] for name in names}
    handles = [modules[name].register_forward_hook(
        lambda _m, inputs, _o, name=name:
            seen[name].append(inputs[0].detach().clone()))
        for name in names]
    run_hooked(model, args, handles)
    return seen


def float64_reference_of(kind, model32, args32):
    """float64_reference for a Family: every Timesteps module of the float64
    copy returns the float64 sinusoid of what the float32 model embedded."""
    embedded = sinusoid_calls(kind, model32, args32)
    model64 = copy.deepcopy(model32).to(torch.float64)
    overrides = FAMILIES[kind].float64_overrides(
        dict(model64.named_modules()), embedded)

    def to64(value):
        if isinstance(value, list):  # Z-Image's per-sample tensors
            return [to64(v) for v in value]
        return (value.to(torch.float64) if torch.is_tensor(value) and
                value.is_floating_point() else value)
    args64 = {k: to64(v) for k, v in args32.items()}
    return capture(kind, model64, args64, sinusoid_overrides=overrides)


class Family:
    """A family's test description; subclasses fill it in."""
    dtypes = ("fp32", "bf16")
    shard = "10GB"
    sinusoids = ()       # its Timesteps modules, by name
    table_sources = {}   # float32 output of a bf16 model: its bf16 addend
    float32_stage = None  # (float32 module rounded to bf16, temb's value)
    pooled_argument = None  # the forward's pooled embedding (POOLED_KINDS)

    def save(self, dtype, folder):
        model = self.build(dtype)
        model.save_pretrained(folder, max_shard_size=self.shard)
        return model

    def extra_inputs(self, rows):
        return {}

    def row_args(self, args, row):
        """The forward's arguments for row `row` of `args` alone, where
        slicing each batch-first tensor does not give them (None)."""
        return None

    def float64_overrides(self, modules, embedded):
        """(module, forward hook) pairs by which the float64 copy's
        Timesteps modules (by name in `modules`) return the float64
        sinusoid of what the float32 model embedded (`embedded`)."""
        overrides = []
        for name, calls in embedded.items():
            calls = iter(calls)

            def override(module, _inputs, _output, calls=calls):
                return float64_timesteps(module, next(calls))
            overrides.append((modules[name], override))
        return overrides


def save_as_loaded(model, dtype, folder, shard="10GB"):
    """Saves float32 `model` as a user holds it in `dtype`: itself in
    float32, else from_pretrained(torch_dtype=dtype) of its float32 folder,
    which keeps its class's _keep_in_fp32_modules in float32.  Returns the
    model saved."""
    if dtype == torch.float32:
        model.save_pretrained(folder, max_shard_size=shard)
        return model
    if importlib.util.find_spec("accelerate") is None:
        pytest.fail("accelerate is required: from_pretrained(torch_dtype) of "
                    f"{type(model).__name__} needs it "
                    "(scripts/requirements-dev.txt)")
    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch)
        loaded = type(model).from_pretrained(scratch, torch_dtype=dtype).eval()
    loaded.save_pretrained(folder, max_shard_size=shard)
    return loaded


def wan_config():
    return dict(patch_size=(1, 2, 2), num_attention_heads=4,
                attention_head_dim=WIDTH // 4, in_channels=4, out_channels=4,
                text_dim=24, freq_dim=256, ffn_dim=32, num_layers=3,
                rope_max_seq_len=32)


class Wan(Family):
    """Wan 2.1/2.2.  In bf16 the model is the one the pipeline has:
    from_pretrained(torch_dtype=bf16) of a float32 folder, which keeps
    time_embedder and the scale_shift_tables in float32
    (_keep_in_fp32_modules); save_pretrained writes it so, in shards."""
    sinusoids = ("condition_embedder.timesteps_proj",)
    scalar_names = ("t_model",)
    float32_stage = ("condition_embedder.time_embedder", "temb_f32")
    table_sources = {"block_mod": "timestep_proj", "norm_out": "temb"}
    shard = "60KB"
    seed = 5

    def build(self, dtype):
        torch.manual_seed(self.seed)
        return diffusers.WanTransformer3DModel(**wan_config()).eval()

    def save(self, dtype, folder):
        loaded = save_as_loaded(self.build(dtype), dtype, folder, self.shard)
        assert loaded.condition_embedder.time_embedder.linear_1.weight.dtype \
            == torch.float32
        return loaded

    def modules(self, model):
        embedder = model.condition_embedder
        found = [
            ("temb", None, embedder, lambda out: out[0]),
            # [N, 6D] as the model unflattens it to [N, 6, D].
            ("timestep_proj", None, embedder,
             lambda out: out[1].unflatten(1, (6, -1))),
        ]
        found += [("block_mod", i, block, TABLE)
                  for i, block in enumerate(model.blocks)]
        found.append(("norm_out", None, model, TABLE))
        return found

    def inputs(self, dtype, t, generator):
        # WanPipeline: timestep = t.expand(B), the scheduler's t as it is.
        batch = t.shape[0]
        return dict(
            hidden_states=torch.randn(batch, 4, 1, 4, 4,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            timestep=t)

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0])]

    def op_checks(self, model):
        embedder = model.condition_embedder
        mlp = embedder.time_embedder
        tables = [block.scale_shift_table for block in model.blocks]
        return [
            ("t_sinus",
             Float32Sinusoid(embedder.timesteps_proj, "t_model")),
            ("temb_h", Float32Linear(mlp.linear_1, "t_sinus")),
            ("temb_a", Float32(lambda v: mlp.act(v["temb_h"]), ulps=4)),
            ("temb_f32", Float32Linear(mlp.linear_2, "temb_a")),
            # .type_as(encoder_hidden_states)
            ("temb", Exact(lambda v: v["temb_f32"].to(torch.bfloat16))),
            ("temb_silu", Exact(lambda v: embedder.act_fn(v["temb"]))),
            ("timestep_proj",
             Linear([embedder.time_proj], "temb_silu", shape=(6, -1))),
            ("block_mod", Float32(lambda v: torch.stack(
                [table + v["timestep_proj"].float() for table in tables],
                dim=1))),
            ("norm_out", Float32(lambda v: model.scale_shift_table +
                                 v["temb"].unsqueeze(1))),
        ]


class WanBf16Stored(Wan):
    """A Wan folder stored in bf16 throughout (model.to(bf16)): the
    pipeline's from_pretrained still upcasts the kept modules to float32,
    so temb reads those tensors as float32 too."""
    dtypes = ("bf16",)
    shard = "10GB"
    seed = 6

    def save(self, dtype, folder):
        self.build(dtype).to(dtype).save_pretrained(folder)
        loaded = diffusers.WanTransformer3DModel.from_pretrained(
            folder, torch_dtype=dtype).eval()
        assert loaded.scale_shift_table.dtype == torch.float32
        return loaded


def flux_modules(model, temb):
    """conditioning_modules of a model built as FLUX.1 (double blocks'
    norm1 and norm1_context, single blocks' norm, the output norm), after
    `temb`'s entry."""
    found = [temb]
    for i, block in enumerate(model.transformer_blocks):
        found.append(("img_mod", i, block.norm1.linear))
        found.append(("txt_mod", i, block.norm1_context.linear))
    found += [("single_mod", i, block.norm.linear)
              for i, block in enumerate(model.single_transformer_blocks)]
    return found + [("norm_out", None, model.norm_out.linear)]


def dual_stream_checks(blocks):
    """op_checks of temb's SiLU and every block's AdaLayerNormZero pair
    (norm1, norm1_context): HunyuanVideo's and HunyuanVideo-1.5's."""
    return [
        ("temb_silu", Exact(lambda v: blocks[0].norm1.silu(v["temb"]))),
        ("img_mod", Linear([b.norm1.linear for b in blocks], "temb_silu",
                           stacked=True)),
        ("txt_mod", Linear([b.norm1_context.linear for b in blocks],
                           "temb_silu", stacked=True)),
    ]


def mlp_checks(prefix, module, source, groups=1):
    """A TimestepEmbedding's three ops against its own modules."""
    return [
        (f"{prefix}_h", Linear([module.linear_1], source, groups=groups)),
        (f"{prefix}_a", Exact(lambda v: module.act(v[f"{prefix}_h"]))),
        (prefix, Linear([module.linear_2], f"{prefix}_a", groups=groups)),
    ]


# PixArt: D = 288 (4 heads of 72), so that alpha's size embedders (D // 3
# each, three of them concatenated) add up to D.
PIXART_WIDTH = 288
# The pipeline's micro-conditions: [height, width] and height / width.
PIXART_RESOLUTION = (896.0, 1152.0)


def ada_layer_norm_single_modules(model, adaln):
    """conditioning_modules of PixArt's and LTX-Video's AdaLayerNormSingle
    `adaln`: its two results, and the sums with every block's table and
    with the output's."""
    found = [
        ("embedded_timestep", None, adaln, lambda out: out[1]),
        ("timestep", None, adaln, lambda out: out[0]),
    ]
    found += [("block_mod", i, block, TABLE)
              for i, block in enumerate(model.transformer_blocks)]
    found.append(("norm_out", None, model, TABLE))
    return found


def ada_layer_norm_single_checks(model, adaln):
    """op_checks after the embedder of PixArt's and Sana's
    AdaLayerNormSingle `adaln`: its Linear, and the sums with the blocks'
    and the output's tables as the model forms them, on temb's inputs."""
    blocks = model.transformer_blocks
    return [
        ("temb_silu", Exact(lambda v: adaln.silu(v["temb"]))),
        ("timestep", Linear([adaln.linear], "temb_silu")),
        ("block_mod", Exact(lambda v: torch.stack(
            [b.scale_shift_table[None] +
             v["timestep"].reshape(v["timestep"].shape[0], 6, -1)
             for b in blocks], dim=1))),
        ("norm_out", Exact(lambda v: model.scale_shift_table[None] +
                           v["temb"][:, None])),
    ]


class PixArt(Family):
    """PixArt-Sigma (use_additional_conditions false) or alpha (true).  The
    alpha model leaves the flag null at sample_size 128, as diffusers
    derives it, so the derivation is what is tested."""
    sinusoids = ("adaln_single.emb.time_proj",)
    scalar_names = ("t_model",)

    def __init__(self, alpha):
        self.alpha = alpha
        if alpha:
            self.sinusoids += ("adaln_single.emb.additional_condition_proj",)
            self.scalar_names += ("res_model", "ar_model")

    def build(self, dtype):
        torch.manual_seed(8 if self.alpha else 9)
        model = diffusers.PixArtTransformer2DModel(
            num_attention_heads=4, attention_head_dim=PIXART_WIDTH // 4,
            in_channels=4, out_channels=8, num_layers=3,
            cross_attention_dim=PIXART_WIDTH, patch_size=2,
            caption_channels=24, sample_size=128 if self.alpha else 32)
        assert model.config.use_additional_conditions is None
        assert model.use_additional_conditions == self.alpha
        return model.to(dtype).eval()

    def extra_inputs(self, rows):
        if not self.alpha:
            return {}
        height, width = PIXART_RESOLUTION
        return {"resolution": [height, width],
                "aspect_ratio": [float(height / width)]}

    def modules(self, model):
        return ada_layer_norm_single_modules(model, model.adaln_single)

    def inputs(self, dtype, t, generator):
        # PixArt(-Sigma)Pipeline: current_timestep.expand(B), the
        # scheduler's t; resolution and aspect_ratio in the text
        # embedding's dtype, the same for every row.
        batch = t.shape[0]
        added = {"resolution": None, "aspect_ratio": None}
        if self.alpha:
            height, width = PIXART_RESOLUTION
            added = {
                "resolution": torch.tensor([height, width]).repeat(
                    batch, 1).to(dtype),
                "aspect_ratio": torch.tensor([float(height / width)]).repeat(
                    batch, 1).to(dtype),
            }
        return dict(
            hidden_states=torch.randn(batch, 4, 4, 4,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            timestep=t, added_cond_kwargs=added)

    def scalars(self, values, embedded):
        pairs = [(values["t_model"], embedded[self.sinusoids[0]][0])]
        if self.alpha:
            resolution, aspect_ratio = embedded[self.sinusoids[1]]
            pairs += [(values["res_model"], resolution),
                      (values["ar_model"], aspect_ratio)]
        return pairs

    def op_checks(self, model):
        adaln = model.adaln_single
        emb = adaln.emb
        checks = [("t_proj", Sinusoid(emb.time_proj, "t_model"))]
        checks += mlp_checks("t_emb", emb.timestep_embedder, "t_proj")
        if self.alpha:
            proj = emb.additional_condition_proj
            checks += [("res_proj", Sinusoid(proj, "res_model", flatten=True))]
            checks += mlp_checks("res_emb", emb.resolution_embedder,
                                 "res_proj", groups=2)
            checks += [("ar_proj", Sinusoid(proj, "ar_model"))]
            checks += mlp_checks("ar_emb", emb.aspect_ratio_embedder,
                                 "ar_proj")
            checks += [
                ("size_emb", Exact(lambda v: torch.cat(
                    [v["res_emb"], v["ar_emb"]], dim=1))),
                ("temb", Exact(lambda v: v["t_emb"] + v["size_emb"])),
            ]
        else:
            checks += [("temb", Exact(lambda v: v["t_emb"]))]
        return checks + ada_layer_norm_single_checks(model, adaln)


class Ltx(Family):
    """LTX-Video: PixArt-Sigma's AdaLayerNormSingle as `time_embed`, its
    tables added per token ([B, T, k, D]).  The text-to-video pipeline's
    call: timestep [B], so T = 1."""
    sinusoids = ("time_embed.emb.time_proj",)
    scalar_names = ("t_model",)

    def build(self, dtype):
        torch.manual_seed(13)
        model = diffusers.LTXVideoTransformer3DModel(
            in_channels=8, out_channels=8, num_attention_heads=4,
            attention_head_dim=WIDTH // 4, cross_attention_dim=WIDTH,
            num_layers=3, caption_channels=24)
        return model.to(dtype).eval()

    def modules(self, model):
        return ada_layer_norm_single_modules(model, model.time_embed)

    def inputs(self, dtype, t, generator):
        # LTXPipeline: t.expand(B), the scheduler's float32 t; a 1 x 2 x 2
        # latent video of 4 tokens.
        batch = t.shape[0]
        return dict(
            hidden_states=torch.randn(batch, 4, 8,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            encoder_attention_mask=torch.ones(batch, TEXT_TOKENS),
            timestep=t, num_frames=1, height=2, width=2)

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0])]

    def op_checks(self, model):
        embed, blocks = model.time_embed, model.transformer_blocks
        checks = [("t_proj", Sinusoid(embed.emb.time_proj, "t_model"))]
        checks += mlp_checks("temb", embed.emb.timestep_embedder, "t_proj")
        checks += [
            ("temb_silu", Exact(lambda v: embed.silu(v["temb"]))),
            ("timestep", Linear([embed.linear], "temb_silu")),
            # As the blocks and the output compute them, on temb's inputs.
            ("block_mod", Exact(lambda v: torch.stack(
                [(b.scale_shift_table[None, None] + v["timestep"].reshape(
                    v["timestep"].shape[0], 1, 6, -1)).flatten(0, 1)
                 for b in blocks], dim=1))),
            ("norm_out", Exact(lambda v: (
                model.scale_shift_table[None, None] +
                v["temb"][:, None, None]).flatten(0, 1))),
        ]
        return checks


class CogVideoX(Family):
    """CogVideoX (time_embed_dim 128, not D, so widths come from the
    config) or CogVideoX 1.5 I2V (ofs_embed_dim set: the ofs embedding,
    fed the pipeline's constant 2.0, adds to the time embedding)."""
    sinusoids = ("time_proj",)
    scalar_names = ("t_model",)

    def __init__(self, ofs):
        self.ofs = ofs
        if ofs:
            self.sinusoids += ("ofs_proj",)
            self.scalar_names += ("ofs_model",)

    def build(self, dtype):
        torch.manual_seed(10 if self.ofs else 11)
        config = dict(num_attention_heads=4, attention_head_dim=WIDTH // 4,
                      in_channels=4, out_channels=4, time_embed_dim=128,
                      text_embed_dim=24, num_layers=3, sample_width=8,
                      sample_height=8, sample_frames=1, patch_size=2,
                      max_text_seq_length=TEXT_TOKENS)
        if self.ofs:
            config.update(ofs_embed_dim=128, patch_size_t=2,
                          use_rotary_positional_embeddings=True,
                          use_learned_positional_embeddings=False)
        model = diffusers.CogVideoXTransformer3DModel(**config)
        return model.to(dtype).eval()

    def extra_inputs(self, rows):
        return {"ofs": [2.0]} if self.ofs else {}

    def modules(self, model):
        found = [("temb", None, model.norm_out, Argument("temb"))]
        for i, block in enumerate(model.transformer_blocks):
            found.append(("norm1", i, block.norm1.linear))
            found.append(("norm2", i, block.norm2.linear))
        found.append(("norm_out", None, model.norm_out.linear))
        return found

    def inputs(self, dtype, t, generator):
        # CogVideoX(Image)ToVideoPipeline: t.expand(B); the 1.5 I2V
        # pipeline's ofs is latents.new_full((1,), 2.0).
        batch = t.shape[0]
        frames = 2 if self.ofs else 1
        args = dict(
            hidden_states=torch.randn(batch, frames, 4, 8, 8,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            timestep=t)
        if self.ofs:
            args["ofs"] = torch.full((1,), 2.0, dtype=dtype)
        return args

    def scalars(self, values, embedded):
        pairs = [(values["t_model"], embedded["time_proj"][0])]
        if self.ofs:
            pairs.append((values["ofs_model"][:1], embedded["ofs_proj"][0]))
        return pairs

    def op_checks(self, model):
        blocks = model.transformer_blocks
        checks = [("t_proj", Sinusoid(model.time_proj, "t_model"))]
        checks += mlp_checks("t_emb", model.time_embedding, "t_proj")
        if self.ofs:
            checks += [("ofs_proj", Sinusoid(model.ofs_proj, "ofs_model"))]
            checks += mlp_checks("ofs_emb", model.ofs_embedding, "ofs_proj")
            checks += [("temb", Exact(lambda v: v["t_emb"] + v["ofs_emb"]))]
        else:
            checks += [("temb", Exact(lambda v: v["t_emb"]))]
        checks += [
            ("temb_silu", Exact(lambda v: blocks[0].norm1.silu(v["temb"]))),
            ("norm1", Linear([b.norm1.linear for b in blocks], "temb_silu",
                             stacked=True)),
            ("norm2", Linear([b.norm2.linear for b in blocks], "temb_silu",
                             stacked=True)),
            ("norm_out", Linear([model.norm_out.linear], "temb_silu")),
        ]
        return checks


class QwenLayered(Family):
    """Qwen-Image-Layered (use_additional_t_cond): temb is the timestep
    MLP's output plus the row of addition_t_embedding, an nn.Embedding(2,
    D), that the forward's additional_t_cond picks.  Its pipeline passes 0;
    the rows here alternate 0 and 1, so both are compared."""
    sinusoids = ("time_text_embed.time_proj",)
    scalar_names = ("t_model",)
    shard = "30KB"

    @staticmethod
    def indices(rows):
        return [i % 2 for i in range(rows)]

    def build(self, dtype):
        torch.manual_seed(12)
        model = diffusers.QwenImageTransformer2DModel(
            patch_size=2, in_channels=16, out_channels=4, num_layers=3,
            attention_head_dim=WIDTH // 4, num_attention_heads=4,
            joint_attention_dim=24, axes_dims_rope=ROPE,
            use_additional_t_cond=True)
        return model.to(dtype).eval()

    def extra_inputs(self, rows):
        return {"addition_t_cond": [float(i) for i in self.indices(rows)]}

    def modules(self, model):
        found = [("temb", None, model.time_text_embed)]
        for i, block in enumerate(model.transformer_blocks):
            found.append(("img_mod", i, block.img_mod[1]))
            found.append(("txt_mod", i, block.txt_mod[1]))
        return found + [("norm_out", None, model.norm_out.linear)]

    def inputs(self, dtype, t, generator):
        # The layered pipeline's call, as Qwen-Image's, with is_rgb.
        batch = t.shape[0]
        return dict(
            hidden_states=torch.randn(batch, 4, 16,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            encoder_hidden_states_mask=torch.ones(batch, TEXT_TOKENS),
            timestep=t.to(dtype) / 1000, img_shapes=[[(1, 2, 2)]] * batch,
            additional_t_cond=torch.tensor(self.indices(batch)))

    def scalars(self, values, embedded):
        return [(values["t_model"],
                 embedded["time_text_embed.time_proj"][0])]

    def op_checks(self, model):
        embed, blocks = model.time_text_embed, model.transformer_blocks
        picked = torch.tensor(self.indices(len(TIMESTEPS)))
        return [("t_proj", Sinusoid(embed.time_proj, "t_model"))] + \
            mlp_checks("t_emb", embed.timestep_embedder, "t_proj") + [
                ("addition_emb", Exact(
                    lambda v: embed.addition_t_embedding(picked))),
                ("temb", Exact(lambda v: v["t_emb"] + v["addition_emb"])),
                ("temb_silu",
                 Exact(lambda v: blocks[0].img_mod[0](v["temb"]))),
                ("img_mod", Linear([b.img_mod[1] for b in blocks],
                                   "temb_silu", stacked=True)),
                ("txt_mod", Linear([b.txt_mod[1] for b in blocks],
                                   "temb_silu", stacked=True)),
                ("norm_out", Linear([model.norm_out.linear], "temb_silu")),
            ]


class Sana(Family):
    """Sana: PixArt-Sigma's AdaLayerNormSingle as `time_embed`, fed the
    pipeline's t * config.timestep_scale (1.3 here, a product float32
    rounds, so the scale's use is what is compared)."""
    sinusoids = ("time_embed.emb.time_proj",)
    scalar_names = ("t_model",)
    timestep_scale = 1.3
    seed = 15
    variant = {}  # Sana-Sprint's guidance embedder

    def build(self, dtype):
        torch.manual_seed(self.seed)
        model = diffusers.SanaTransformer2DModel(
            in_channels=4, out_channels=4, num_attention_heads=4,
            attention_head_dim=WIDTH // 4, num_layers=3,
            num_cross_attention_heads=4, cross_attention_head_dim=WIDTH // 4,
            cross_attention_dim=WIDTH, caption_channels=24, sample_size=4,
            patch_size=1, timestep_scale=self.timestep_scale, **self.variant)
        return model.to(dtype).eval()

    def modules(self, model):
        return ada_layer_norm_single_modules(model, model.time_embed)

    def inputs(self, dtype, t, generator):
        # SanaPipeline: t.expand(B) * transformer.config.timestep_scale.
        batch = t.shape[0]
        return dict(
            hidden_states=torch.randn(batch, 4, 4, 4,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            encoder_attention_mask=torch.ones(batch, TEXT_TOKENS),
            timestep=t * self.timestep_scale)

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0])]

    def op_checks(self, model):
        embed = model.time_embed
        checks = [("t_proj", Sinusoid(embed.emb.time_proj, "t_model"))]
        checks += mlp_checks("temb", embed.emb.timestep_embedder, "t_proj")
        return checks + ada_layer_norm_single_checks(model, embed)


class SanaSprint(Sana):
    """Sana-Sprint (guidance_embeds): SanaCombinedTimestepGuidanceEmbeddings,
    t's and the guidance's TimestepEmbeddings summed, then
    AdaLayerNormSingle's Linear and tables.  SanaSprintPipeline passes its
    own timestep (sin / (cos + sin) of SCMScheduler's t) unscaled, whatever
    the config's timestep_scale (1.3 here, so that a use of it shows), and
    the guidance scale .to(dtype) * config.guidance_embeds_scale (0.3 here:
    a product the model's dtype rounds)."""
    sinusoids = ("time_embed.time_proj", "time_embed.guidance_condition_proj")
    scalar_names = ("t_model", "g_model")
    guidance_embeds_scale = 0.3
    seed = 19
    variant = dict(guidance_embeds=True,
                   guidance_embeds_scale=guidance_embeds_scale,
                   qk_norm="rms_norm_across_heads")

    def inputs(self, dtype, t, generator):
        batch = t.shape[0]
        guidance = torch.full([batch], GUIDANCE, dtype=torch.float32)
        return dict(super().inputs(dtype, t, generator), timestep=t,
                    guidance=guidance.to(dtype) * self.guidance_embeds_scale)

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0]),
                (values["g_model"], embedded[self.sinusoids[1]][0])]

    def op_checks(self, model):
        embed = model.time_embed
        checks = [("t_proj", Sinusoid(embed.time_proj, "t_model"))]
        checks += mlp_checks("t_emb", embed.timestep_embedder, "t_proj")
        checks += [("g_proj",
                    Sinusoid(embed.guidance_condition_proj, "g_model"))]
        checks += mlp_checks("g_emb", embed.guidance_embedder, "g_proj")
        checks += [("temb", Exact(lambda v: v["t_emb"] + v["g_emb"]))]
        return checks + ada_layer_norm_single_checks(model, embed)


class ZImage(Family):
    """Z-Image: the pipeline's (1000 - t) / 1000 times the config's t_scale,
    embedded by TimestepEmbedder's own sinusoid into a 256-wide temb; every
    modulated block's adaLN_modulation is a Linear of temb without SiLU,
    the final layer's SiLU then Linear."""
    sinusoids = ("t_embedder",)  # records what its sinusoid embeds
    scalar_names = ("t_model",)
    shard = "300KB"

    def build(self, dtype):
        torch.manual_seed(16)
        model = diffusers.ZImageTransformer2DModel(
            all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4,
            dim=WIDTH, n_layers=3, n_refiner_layers=2, n_heads=4,
            n_kv_heads=4, cap_feat_dim=24, axes_dims=[16, 24, 24],
            axes_lens=[64, 32, 32])
        return model.to(dtype).eval()

    def modules(self, model):
        found = [("temb", None, model.t_embedder)]
        found += [("refiner_mod", i, block.adaLN_modulation[0])
                  for i, block in enumerate(model.noise_refiner)]
        found += [("layer_mod", i, block.adaLN_modulation[0])
                  for i, block in enumerate(model.layers)]
        return found + [("final_mod", None, model.all_final_layer[
            "2-1"].adaLN_modulation[1])]

    def inputs(self, dtype, t, generator):
        # ZImagePipeline: (1000 - t) / 1000 in float32; a list of latents
        # and of caption features, one per sample.
        batch = t.shape[0]
        return dict(
            x=[torch.randn(4, 1, 4, 4, generator=generator).to(dtype)
               for _ in range(batch)],
            t=(1000 - t) / 1000,
            cap_feats=[torch.randn(TEXT_TOKENS, 24,
                                   generator=generator).to(dtype)
                       for _ in range(batch)])

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded["t_embedder"][0])]

    def float64_overrides(self, modules, embedded):
        # The sinusoid is TimestepEmbedder's static method, not a module:
        # the float64 copy's is replaced on the instance.
        calls = iter(embedded["t_embedder"])
        spec = types.SimpleNamespace(num_channels=256, scale=1,
                                     downscale_freq_shift=0,
                                     flip_sin_to_cos=True)
        modules["t_embedder"].timestep_embedding = (
            lambda _t, _dim, max_period=10000: float64_timesteps(
                spec, next(calls)))
        return []

    def op_checks(self, model):
        embed = model.t_embedder
        final = model.all_final_layer["2-1"].adaLN_modulation
        checks = [
            ("t_proj", Sinusoid(lambda x: embed.timestep_embedding(x, 256),
                                "t_model")),
            ("temb_h", Linear([embed.mlp[0]], "t_proj")),
            ("temb_a", Exact(lambda v: embed.mlp[1](v["temb_h"]))),
            ("temb", Linear([embed.mlp[2]], "temb_a")),
            ("refiner_mod", Linear([b.adaLN_modulation[0]
                                    for b in model.noise_refiner], "temb",
                                   stacked=True)),
            ("layer_mod", Linear([b.adaLN_modulation[0]
                                  for b in model.layers], "temb",
                                 stacked=True)),
            ("temb_silu", Exact(lambda v: final[0](v["temb"]))),
            ("final_mod", Linear([final[1]], "temb_silu")),
        ]
        return checks


class Lumina2(Family):
    """Lumina-Image-2.0: the pipeline's 1 - t / 1000 embedded with no factor
    1000 into a min(D, 1024) wide temb; every modulated block's
    LuminaRMSNormZero and the output norm's linear_1 of SiLU(temb)."""
    sinusoids = ("time_caption_embed.time_proj",)
    scalar_names = ("t_model",)

    def build(self, dtype):
        torch.manual_seed(17)
        model = diffusers.Lumina2Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=4, hidden_size=WIDTH,
            num_layers=3, num_refiner_layers=2, num_attention_heads=4,
            num_kv_heads=4, multiple_of=16, cap_feat_dim=24,
            axes_dim_rope=(16, 24, 24), axes_lens=(64, 32, 32))
        return model.to(dtype).eval()

    def modules(self, model):
        found = [("temb", None, model.time_caption_embed,
                  lambda out: out[0])]
        found += [("refiner_mod", i, block.norm1.linear)
                  for i, block in enumerate(model.noise_refiner)]
        found += [("layer_mod", i, block.norm1.linear)
                  for i, block in enumerate(model.layers)]
        return found + [("norm_out", None, model.norm_out.linear_1)]

    def inputs(self, dtype, t, generator):
        # Lumina2Pipeline: 1 - t / num_train_timesteps, float32.
        batch = t.shape[0]
        return dict(
            hidden_states=torch.randn(batch, 4, 4, 4,
                                      generator=generator).to(dtype),
            timestep=1 - t / 1000,
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            encoder_attention_mask=torch.ones(batch, TEXT_TOKENS,
                                              dtype=torch.bool))

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0])]

    def op_checks(self, model):
        embed = model.time_caption_embed
        checks = [("t_proj", Sinusoid(embed.time_proj, "t_model"))]
        checks += mlp_checks("temb", embed.timestep_embedder, "t_proj")
        return checks + [
            ("temb_silu",
             Exact(lambda v: model.layers[0].norm1.silu(v["temb"]))),
            ("refiner_mod", Linear([b.norm1.linear
                                    for b in model.noise_refiner],
                                   "temb_silu", stacked=True)),
            ("layer_mod", Linear([b.norm1.linear for b in model.layers],
                                 "temb_silu", stacked=True)),
            ("norm_out", Linear([model.norm_out.linear_1], "temb_silu")),
        ]


class HunyuanVideo(Family):
    """HunyuanVideo (1.0): FLUX.1-dev's conditioning (t, guidance and the
    pooled CLIP embedding; double, single and output modulations), fed the
    pipeline's float32 t and its guidance * 1000 in the model's dtype.  The
    token refiner keeps its own time embedding and is not compared."""
    sinusoids = ("time_text_embed.time_proj",)  # t, then the guidance
    scalar_names = ("t_model", "g_model")
    pooled_argument = "pooled_projections"
    seed = 18
    channels = 4  # the latents', and the image-to-video inputs'
    variant = {}  # image_condition_type, guidance_embeds

    def build(self, dtype):
        torch.manual_seed(self.seed)
        model = diffusers.HunyuanVideoTransformer3DModel(
            in_channels=self.channels, out_channels=4, num_attention_heads=4,
            attention_head_dim=WIDTH // 4, num_layers=2, num_single_layers=3,
            num_refiner_layers=1, patch_size=1, patch_size_t=1,
            text_embed_dim=24, pooled_projection_dim=POOLED,
            rope_axes_dim=(16, 24, 24), **self.variant)
        return model.to(dtype).eval()

    def modules(self, model):
        return flux_modules(model, ("temb", None, model.time_text_embed,
                                    lambda out: out[0]))

    def inputs(self, dtype, t, generator):
        # HunyuanVideoPipeline: t.expand(B).to(latents.dtype), float32; the
        # guidance tensor made in the transformer's dtype, times 1000, where
        # the model embeds it (the image-to-video pipeline puts the image
        # latents and mask on the channels for latent_concat).
        batch = t.shape[0]
        args = dict(
            hidden_states=torch.randn(batch, self.channels, 1, 2, 2,
                                      generator=generator).to(dtype),
            timestep=t,
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            encoder_attention_mask=torch.ones(batch, TEXT_TOKENS))
        if self.variant.get("guidance_embeds", True):
            args["guidance"] = torch.full([batch], GUIDANCE,
                                          dtype=dtype) * 1000.0
        return args

    def scalars(self, values, embedded):
        t_seen, g_seen = embedded[self.sinusoids[0]]
        return [(values["t_model"], t_seen), (values["g_model"], g_seen)]

    def op_checks(self, model):
        embed, blocks = model.time_text_embed, model.transformer_blocks
        text = embed.text_embedder
        checks = [("t_proj", Sinusoid(embed.time_proj, "t_model"))]
        checks += mlp_checks("t_emb", embed.timestep_embedder, "t_proj")
        if embed.guidance_embedder is None:  # no guidance: t_emb alone
            checks += [("tg_emb", Exact(lambda v: v["t_emb"]))]
        else:
            checks += [("g_proj", Sinusoid(embed.time_proj, "g_model"))]
            checks += mlp_checks("g_emb", embed.guidance_embedder, "g_proj")
            checks += [("tg_emb", Exact(lambda v: v["t_emb"] + v["g_emb"]))]
        return checks + [
            ("p_emb_h", Linear([text.linear_1], "pooled_model")),
            ("p_emb_a", Exact(lambda v: text.act_1(v["p_emb_h"]))),
            ("p_emb", Linear([text.linear_2], "p_emb_a")),
            ("temb", Exact(lambda v: v["tg_emb"] + v["p_emb"])),
        ] + dual_stream_checks(blocks) + [
            ("single_mod", Linear([b.norm.linear for b in
                                   model.single_transformer_blocks],
                                  "temb_silu", stacked=True)),
            ("norm_out", Linear([model.norm_out.linear], "temb_silu")),
        ]


class HunyuanVideoFramepack(HunyuanVideo):
    """HunyuanVideo-FramePack: HunyuanVideo's time embedding, blocks and
    output norm; the clean and history latents join the sequence with no
    timestep of their own, the image embedding joins the text."""
    seed = 48

    def build(self, dtype):
        torch.manual_seed(self.seed)
        model = diffusers.HunyuanVideoFramepackTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=4,
            attention_head_dim=WIDTH // 4, num_layers=2, num_single_layers=3,
            num_refiner_layers=1, patch_size=2, patch_size_t=1,
            text_embed_dim=24, pooled_projection_dim=POOLED,
            rope_axes_dim=(16, 24, 24), has_image_proj=True,
            image_proj_dim=16, has_clean_x_embedder=True)
        return model.to(dtype).eval()

    @staticmethod
    def history(batch, randn):
        """What the pipeline hands beside the latents, from `randn(*shape)`
        in the model's dtype: the image embedding, the clean and history
        latents and the positions of each."""
        return dict(
            image_embeds=randn(batch, 3, 16),
            indices_latents=torch.tensor([3]),
            latents_clean=randn(batch, 4, 2, 8, 8),
            indices_latents_clean=torch.tensor([0, 4]),
            latents_history_2x=randn(batch, 4, 2, 8, 8),
            indices_latents_history_2x=torch.tensor([5, 6]),
            latents_history_4x=randn(batch, 4, 4, 8, 8),
            indices_latents_history_4x=torch.tensor([7, 8, 9, 10]))

    def inputs(self, dtype, t, generator):
        # HunyuanVideoFramepackPipeline: t.expand(B), float32; guidance
        # made in the transformer's dtype, times 1000; the image embedding
        # and the latents in the transformer's dtype.
        batch = t.shape[0]

        def randn(*shape):
            return torch.randn(*shape, generator=generator).to(dtype)
        return dict(
            hidden_states=randn(batch, 4, 1, 8, 8), timestep=t,
            encoder_hidden_states=randn(batch, TEXT_TOKENS, 24),
            encoder_attention_mask=torch.ones(batch, TEXT_TOKENS),
            **self.history(batch, randn),
            guidance=torch.full([batch], GUIDANCE, dtype=dtype) * 1000.0)


class HunyuanVideoI2V(HunyuanVideo):
    """HunyuanVideo-I2V's latent_concat variant: the image latents and a
    mask concatenated to the latents' channels, no guidance embedder; its
    conditioning is the text-to-video model's without the guidance."""
    scalar_names = ("t_model",)
    seed = 20
    channels = 9  # latents, image latents, mask
    variant = dict(guidance_embeds=False, image_condition_type="latent_concat")

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0])]


class HunyuanVideoTokenReplace(HunyuanVideo):
    """HunyuanVideo-I2V's token_replace variant: besides temb, a second
    row for the first frame's tokens, token_replace_emb = the timestep
    MLP at t = 0 plus the pooled MLP (no guidance), read by the image and
    single-stream modulation Linears (each called twice per forward)."""
    scalar_names = ("t_model", "tr_model", "g_model")
    seed = 22
    variant = dict(image_condition_type="token_replace")

    def modules(self, model):
        embed = model.time_text_embed
        found = [("temb", None, embed, lambda out: out[0]),
                 ("tr_temb", None, embed, lambda out: out[1])]
        for i, block in enumerate(model.transformer_blocks):
            found.append(("img_mod", i, block.norm1.linear, NthCall(0)))
            found.append(("tr_img_mod", i, block.norm1.linear, NthCall(1)))
            found.append(("txt_mod", i, block.norm1_context.linear))
        for i, block in enumerate(model.single_transformer_blocks):
            found.append(("single_mod", i, block.norm.linear, NthCall(0)))
            found.append(("tr_single_mod", i, block.norm.linear, NthCall(1)))
        return found + [("norm_out", None, model.norm_out.linear)]

    def scalars(self, values, embedded):
        # time_proj embeds t, then zeros_like(t), then the guidance.
        t_seen, zero_seen, g_seen = embedded[self.sinusoids[0]]
        return [(values["t_model"], t_seen), (values["tr_model"], zero_seen),
                (values["g_model"], g_seen)]

    def op_checks(self, model):
        embed, blocks = model.time_text_embed, model.transformer_blocks
        return super().op_checks(model) + [
            ("tr_signed", Exact(lambda v: torch.zeros_like(v["t_model"]))),
            ("tr_proj", Sinusoid(embed.time_proj, "tr_model")),
        ] + mlp_checks("tr_t_emb", embed.timestep_embedder, "tr_proj") + [
            ("tr_temb", Exact(lambda v: v["tr_t_emb"] + v["p_emb"])),
            ("tr_temb_silu",
             Exact(lambda v: blocks[0].norm1.silu(v["tr_temb"]))),
            ("tr_img_mod", Linear([b.norm1.linear for b in blocks],
                                  "tr_temb_silu", stacked=True)),
            ("tr_single_mod", Linear([b.norm.linear for b in
                                      model.single_transformer_blocks],
                                     "tr_temb_silu", stacked=True)),
        ]


class HunyuanVideo15SR(Family):
    """HunyuanVideo-1.5's super-resolution model (use_meanflow): temb is
    t's embedding plus timestep_r's (the next step's timestep, 0 at the
    last), each through its own Timesteps and TimestepEmbedding, both in
    the latents' dtype as the pipeline passes them; then the main path's
    modulations."""
    sinusoids = ("time_embed.time_proj", "time_embed.time_proj_r")
    scalar_names = ("t_model", "r_model")

    @staticmethod
    def next_timesteps(rows):
        return [0.0 if i == rows - 1 else TIMESTEPS[(i + 1) % len(TIMESTEPS)]
                for i in range(rows)]

    def build(self, dtype):
        torch.manual_seed(21)
        model = diffusers.HunyuanVideo15Transformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=4,
            attention_head_dim=WIDTH // 4, num_layers=3, num_refiner_layers=1,
            text_embed_dim=24, text_embed_2_dim=24, image_embed_dim=24,
            rope_axes_dim=ROPE, use_meanflow=True)
        return model.to(dtype).eval()

    def extra_inputs(self, rows):
        return {"timestep_r": self.next_timesteps(rows)}

    def modules(self, model):
        found = [("temb", None, model.time_embed)]
        for i, block in enumerate(model.transformer_blocks):
            found.append(("img_mod", i, block.norm1.linear))
            found.append(("txt_mod", i, block.norm1_context.linear))
        return found + [("norm_out", None, model.norm_out.linear)]

    def inputs(self, dtype, t, generator):
        # HunyuanVideo15ImageToVideoPipeline with use_meanflow: timestep_r
        # expanded to the batch in the latents' dtype, as t.
        next_t = torch.tensor(self.next_timesteps(t.shape[0]))
        return dict(hunyuan_video15_inputs(dtype, t, generator),
                    timestep_r=next_t.to(dtype))

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0]),
                (values["r_model"], embedded[self.sinusoids[1]][0])]

    def op_checks(self, model):
        embed, blocks = model.time_embed, model.transformer_blocks
        checks = [("t_proj", Sinusoid(embed.time_proj, "t_model"))]
        checks += mlp_checks("t_emb", embed.timestep_embedder, "t_proj")
        checks += [("r_proj", Sinusoid(embed.time_proj_r, "r_model"))]
        checks += mlp_checks("r_emb", embed.timestep_embedder_r, "r_proj")
        return checks + [
            ("temb", Exact(lambda v: v["t_emb"] + v["r_emb"])),
        ] + dual_stream_checks(blocks) + [
            ("norm_out", Linear([model.norm_out.linear], "temb_silu")),
        ]


class HunyuanImage(Family):
    """HunyuanImage-2.1, distilled and MeanFlow at once: t (and the next
    timestep, 0 at the last) in the model's dtype, each embedded and
    averaged, plus the guidance scale's embedding (scale * 1000 in the
    model's dtype); FLUX.1's modulations."""
    sinusoids = ("time_guidance_embed.time_proj",  # t, then the guidance
                 "time_guidance_embed.time_proj_r")
    scalar_names = ("t_model", "r_model", "g_model")

    def build(self, dtype):
        torch.manual_seed(48)
        model = diffusers.HunyuanImageTransformer2DModel(
            in_channels=4, out_channels=4, num_attention_heads=4,
            attention_head_dim=WIDTH // 4, num_layers=2, num_single_layers=3,
            num_refiner_layers=1, patch_size=(1, 1), text_embed_dim=24,
            rope_axes_dim=(32, 32), guidance_embeds=True, use_meanflow=True)
        return model.to(dtype).eval()

    def extra_inputs(self, rows):
        return {"timestep_r": HunyuanVideo15SR.next_timesteps(rows)}

    def modules(self, model):
        return flux_modules(model, ("temb", None, model.time_guidance_embed))

    def inputs(self, dtype, t, generator):
        # HunyuanImagePipeline: t and timestep_r .to(latents' dtype), the
        # model's; the distilled guidance made in the transformer's dtype,
        # times 1000.
        batch = t.shape[0]
        next_t = torch.tensor(HunyuanVideo15SR.next_timesteps(batch))
        return dict(
            hidden_states=torch.randn(batch, 4, 2, 2,
                                      generator=generator).to(dtype),
            timestep=t.to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            encoder_attention_mask=torch.ones(batch, TEXT_TOKENS),
            timestep_r=next_t.to(dtype),
            guidance=torch.full([batch], GUIDANCE, dtype=dtype) * 1000.0)

    def scalars(self, values, embedded):
        t_seen, g_seen = embedded[self.sinusoids[0]]
        return [(values["t_model"], t_seen),
                (values["r_model"], embedded[self.sinusoids[1]][0]),
                (values["g_model"], g_seen)]

    def op_checks(self, model):
        embed, blocks = model.time_guidance_embed, model.transformer_blocks
        checks = [("t_proj", Sinusoid(embed.time_proj, "t_model"))]
        checks += mlp_checks("t_emb", embed.timestep_embedder, "t_proj")
        checks += [("r_proj", Sinusoid(embed.time_proj_r, "r_model"))]
        checks += mlp_checks("r_emb", embed.timestep_embedder_r, "r_proj")
        checks += [("g_proj", Sinusoid(embed.time_proj, "g_model"))]
        checks += mlp_checks("g_emb", embed.guidance_embedder, "g_proj")
        return checks + [
            ("t_mean", Exact(lambda v: (v["t_emb"] + v["r_emb"]) / 2)),
            ("temb", Exact(lambda v: v["t_mean"] + v["g_emb"])),
        ] + dual_stream_checks(blocks) + [
            ("single_mod", Linear([b.norm.linear for b in
                                   model.single_transformer_blocks],
                                  "temb_silu", stacked=True)),
            ("norm_out", Linear([model.norm_out.linear], "temb_silu")),
        ]


class Chroma(Family):
    """Chroma: no block has a modulation Linear; the distilled guidance
    layer (in_proj, 5 residual RMSNorm -> MLP layers, out_proj) maps, for
    each of the 3 * 3 + 12 * 2 + 2 = 35 modulation indices, [the 16-wide
    sinusoids of t and of guidance 0, the index's row of the mod_proj
    buffer] to its D-wide vector.  FLUX.1's pipeline and model arithmetic
    on t."""
    sinusoids = ("time_text_embed.time_proj", "time_text_embed.guidance_proj")
    scalar_names = ("t_model", "g_model")
    hidden = 256

    def build(self, dtype):
        torch.manual_seed(23)
        model = diffusers.ChromaTransformer2DModel(
            patch_size=1, in_channels=4, num_layers=2, num_single_layers=3,
            attention_head_dim=WIDTH // 4, num_attention_heads=4,
            joint_attention_dim=24, axes_dims_rope=ROPE,
            approximator_hidden_dim=self.hidden)
        return model.to(dtype).eval()

    @staticmethod
    def indices(model):
        return model.time_text_embed.mod_proj.shape[0]

    def modules(self, model):
        return [("pooled_temb", None, model.distilled_guidance_layer)]

    def inputs(self, dtype, t, generator):
        # ChromaPipeline: t.expand(B).to(latents.dtype) / 1000, as FLUX.1's.
        batch = t.shape[0]
        return dict(
            hidden_states=torch.randn(batch, 4, 4,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            timestep=t.to(dtype) / 1000, img_ids=torch.zeros(4, 3),
            txt_ids=torch.zeros(TEXT_TOKENS, 3))

    def scalars(self, values, embedded):
        # The guidance projection embeds an integer tensor of zeros.
        (t_seen,), (g_seen,) = (embedded[name] for name in self.sinusoids)
        return [(values["t_model"], t_seen),
                (values["g_model"], g_seen.to(torch.float32))]

    def op_checks(self, model):
        embed = model.time_text_embed
        layer = model.distilled_guidance_layer
        groups = self.indices(model)

        def per_index(module, name):
            # A module of the approximator applied to temb's [N, I * W].
            return Exact(lambda v: module(
                v[name].unflatten(-1, (groups, -1))).flatten(1))

        checks = [
            ("t_proj", Sinusoid(embed.time_proj, "t_model")),
            ("g_proj", Sinusoid(embed.guidance_proj, "g_model")),
            ("tg_proj", Exact(lambda v: torch.cat([v["t_proj"], v["g_proj"]],
                                                  dim=1))),
            ("index_proj", Exact(lambda v: embed.mod_proj.to(
                v["t_proj"].dtype).flatten()[None].expand(
                    v["t_proj"].shape[0], -1))),
            ("approx_in", Exact(lambda v: torch.cat(
                [v["tg_proj"][:, None].expand(-1, groups, -1),
                 v["index_proj"].unflatten(-1, (groups, -1))],
                dim=-1).flatten(1))),
            ("approx_0", Linear([layer.in_proj], "approx_in", groups=groups)),
        ]
        for j, (mlp, norm) in enumerate(zip(layer.layers, layer.norms)):
            x = f"approx_{j}"
            checks += [
                (f"{x}_norm", per_index(norm, x)),
                (f"{x}_h", Linear([mlp.linear_1], f"{x}_norm", groups=groups)),
                (f"{x}_a", Exact(lambda v, x=x, mlp=mlp: mlp.act_1(
                    v[f"{x}_h"]))),
                (f"{x}_o", Linear([mlp.linear_2], f"{x}_a", groups=groups)),
                (f"approx_{j + 1}", Exact(lambda v, x=x: v[x] + v[f"{x}_o"])),
            ]
        return checks + [("pooled_temb", Linear([layer.out_proj], "approx_5",
                                                groups=groups))]


class AuraFlow(Family):
    """AuraFlow: the pipeline's t / 1000 in the latents' dtype, embedded
    with the factor 1000 inside the sinusoid; every joint block's norm1 and
    norm1_context, every single block's norm1 and the output norm's Linear,
    of SiLU(temb), none with a bias."""
    sinusoids = ("time_step_embed",)
    scalar_names = ("t_model",)

    def build(self, dtype):
        torch.manual_seed(41)
        model = diffusers.AuraFlowTransformer2DModel(
            sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=2,
            num_single_dit_layers=3, attention_head_dim=WIDTH // 4,
            num_attention_heads=4, joint_attention_dim=24,
            caption_projection_dim=WIDTH, out_channels=4,
            pos_embed_max_size=16)
        return model.to(dtype).eval()

    def modules(self, model):
        found = [("temb", None, model.time_step_proj)]
        for i, block in enumerate(model.joint_transformer_blocks):
            found += [("joint_img_mod", i, block.norm1.linear),
                      ("joint_txt_mod", i, block.norm1_context.linear)]
        found += [("single_mod", i, block.norm1.linear)
                  for i, block in enumerate(model.single_transformer_blocks)]
        return found + [("norm_out", None, model.norm_out.linear)]

    def inputs(self, dtype, t, generator):
        # AuraFlowPipeline: torch.tensor([t / 1000]).to(latents.dtype).
        batch = t.shape[0]
        return dict(
            hidden_states=torch.randn(batch, 4, 8, 8,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            timestep=(t / 1000).to(dtype))

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0])]

    def op_checks(self, model):
        joint, single = (model.joint_transformer_blocks,
                         model.single_transformer_blocks)
        checks = [("t_proj", Sinusoid(model.time_step_embed, "t_model"))]
        checks += mlp_checks("temb", model.time_step_proj, "t_proj")
        return checks + [
            ("temb_silu", Exact(lambda v: model.norm_out.silu(v["temb"]))),
            ("joint_img_mod", Linear([b.norm1.linear for b in joint],
                                     "temb_silu", stacked=True)),
            ("joint_txt_mod", Linear([b.norm1_context.linear for b in joint],
                                     "temb_silu", stacked=True)),
            ("single_mod", Linear([b.norm1.linear for b in single],
                                  "temb_silu", stacked=True)),
            ("norm_out", Linear([model.norm_out.linear], "temb_silu")),
        ]


class FluxTimeOnly(Family):
    """FLUX.1-schnell's build without the pooled text embedding (LongCat-
    Image, Ovis-Image): the pipeline's t.expand(B).to(latents' dtype) /
    1000, times 1000 in the model's dtype, one TimestepEmbedding, FLUX.1's
    double, single and output modulations."""
    scalar_names = ("t_model",)

    def __init__(self, cls, seed, embed, config):
        self.cls, self.seed, self.embed, self.config = cls, seed, embed, config
        self.sinusoids = (f"{embed}time_proj",)

    def build(self, dtype):
        torch.manual_seed(self.seed)
        model = self.cls(patch_size=1, in_channels=4, num_layers=2,
                         num_single_layers=3, attention_head_dim=WIDTH // 4,
                         num_attention_heads=4, joint_attention_dim=24,
                         axes_dims_rope=(16, 24, 24), **self.config)
        return model.to(dtype).eval()

    def embedder(self, model):
        return model.get_submodule(self.embed[:-1]) if self.embed else model

    def modules(self, model):
        return flux_modules(
            model, ("temb", None, self.embedder(model).timestep_embedder))

    def inputs(self, dtype, t, generator):
        # The pipelines: t.expand(B).to(latents.dtype), then / 1000.
        batch = t.shape[0]
        return dict(
            hidden_states=torch.randn(batch, 4, 4,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            timestep=t.to(dtype) / 1000, img_ids=torch.zeros(4, 3),
            txt_ids=torch.zeros(TEXT_TOKENS, 3))

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0])]

    def op_checks(self, model):
        embed = self.embedder(model)
        checks = [("t_proj", Sinusoid(embed.time_proj, "t_model"))]
        checks += mlp_checks("temb", embed.timestep_embedder, "t_proj")
        return checks + dual_stream_checks(model.transformer_blocks) + [
            ("single_mod", Linear([b.norm.linear for b in
                                   model.single_transformer_blocks],
                                  "temb_silu", stacked=True)),
            ("norm_out", Linear([model.norm_out.linear], "temb_silu")),
        ]


class Bria(FluxTimeOnly):
    """Bria 3.2: the scheduler's float32 t cast to the model's dtype, its
    sinusoid with max_period = time_theta (here not the default), FLUX.1's
    modulations."""

    def __init__(self):
        super().__init__(diffusers.BriaTransformer2DModel, 47, "time_embed.",
                         {"time_theta": 2000})

    def inputs(self, dtype, t, generator):
        # BriaPipeline: t.expand(B), float32.
        args = super().inputs(dtype, t, generator)
        args["timestep"] = t
        return args


class BriaFibo(Bria):
    """Bria FIBO: Bria 3.2's time embedding and modulations; its pipelines
    pass t.expand(B) in the latents' dtype, and a list of text encoder
    layers (one per block) that reach the text tokens only."""

    def __init__(self):
        FluxTimeOnly.__init__(self, diffusers.BriaFiboTransformer2DModel, 49,
                              "time_embed.",
                              {"time_theta": 2000, "text_encoder_dim": 16})

    def inputs(self, dtype, t, generator):
        args = super().inputs(dtype, t, generator)
        args["timestep"] = t.to(dtype)
        args["text_encoder_layers"] = [
            torch.randn(t.shape[0], TEXT_TOKENS, 16,
                        generator=generator).to(dtype) for _ in range(5)]
        return args

    def row_args(self, args, row):
        one = {key: value[row:row + 1] if torch.is_tensor(value) and
               value.dim() > 0 and value.shape[0] == len(args["timestep"])
               else value for key, value in args.items()}
        one["text_encoder_layers"] = [layer[row:row + 1] for layer in
                                      args["text_encoder_layers"]]
        return one


class MotifVideo(FluxTimeOnly):
    """Motif-Video: FLUX.1's blocks over one TimestepEmbedding of the
    pipeline's float32 t as it is (no x 1000), the sinusoid cast to the
    MLP's dtype."""

    def __init__(self):
        super().__init__(diffusers.MotifVideoTransformer3DModel, 50,
                         "time_text_embed.", {})

    def build(self, dtype):
        torch.manual_seed(self.seed)
        model = self.cls(in_channels=4, out_channels=4, num_attention_heads=4,
                         attention_head_dim=WIDTH // 4, num_layers=2,
                         num_single_layers=3, text_embed_dim=24,
                         rope_axes_dim=(16, 24, 24))
        return model.to(dtype).eval()

    def inputs(self, dtype, t, generator):
        # MotifVideoPipeline: t.expand(B), the scheduler's float32 t.
        batch = t.shape[0]
        return dict(
            hidden_states=torch.randn(batch, 4, 1, 4, 4,
                                      generator=generator).to(dtype),
            timestep=t,
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            encoder_attention_mask=torch.ones(batch, TEXT_TOKENS))


# CogView4's size conditions as its pipeline passes them, one per row, in
# the prompt embedding's dtype (exact in bf16).
COGVIEW4_SIZES = {"original_size": (896.0, 1152.0),
                  "crop_coords": (0.0, 16.0),
                  "target_size": (1024.0, 768.0)}


class CogView4(Family):
    """CogView4: the scheduler's float32 t embedded D wide, plus the
    sinusoids of the three size conditions through condition_embedder,
    summed; the forward's one SiLU of that is read by every block's
    norm1.linear (12D, image and text interleaved) and the output norm's
    Linear."""
    sinusoids = ("time_condition_embed.time_proj",
                 "time_condition_embed.condition_proj")
    scalar_names = ("t_model", "original_size_model", "crop_coords_model",
                    "target_size_model")

    def build(self, dtype):
        torch.manual_seed(44)
        model = diffusers.CogView4Transformer2DModel(
            patch_size=2, in_channels=4, out_channels=4, num_layers=2,
            attention_head_dim=WIDTH // 4, num_attention_heads=4,
            text_embed_dim=24, time_embed_dim=48, condition_dim=16,
            pos_embed_max_size=16, sample_size=8, rope_axes_dim=(32, 32))
        return model.to(dtype).eval()

    def extra_inputs(self, rows):
        return {name: list(value) for name, value in COGVIEW4_SIZES.items()}

    def modules(self, model):
        found = [("temb", None, model.time_condition_embed)]
        found += [("block_mod", i, block.norm1.linear)
                  for i, block in enumerate(model.transformer_blocks)]
        return found + [("norm_out", None, model.norm_out.linear)]

    def inputs(self, dtype, t, generator):
        # CogView4Pipeline: t.expand(B); the sizes repeated per row in the
        # prompt embedding's dtype.
        batch = t.shape[0]
        sizes = {name: torch.tensor([value]).repeat(batch, 1).to(dtype)
                 for name, value in COGVIEW4_SIZES.items()}
        return dict(
            hidden_states=torch.randn(batch, 4, 8, 8,
                                      generator=generator).to(dtype),
            encoder_hidden_states=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            timestep=t, **sizes)

    def scalars(self, values, embedded):
        pairs = [(values["t_model"], embedded[self.sinusoids[0]][0])]
        for name, seen in zip(COGVIEW4_SIZES, embedded[self.sinusoids[1]]):
            pairs.append((values[f"{name}_model"], seen))
        return pairs

    def op_checks(self, model):
        embed = model.time_condition_embed
        checks = [("t_proj", Sinusoid(embed.time_proj, "t_model"))]
        checks += mlp_checks("t_emb", embed.timestep_embedder, "t_proj")
        condition = embed.condition_embedder
        return checks + [
            ("sizes", Exact(lambda v: torch.cat(
                [embed.condition_proj(v[f"{name}_model"].flatten()).view(
                    v[f"{name}_model"].shape[0], -1)
                 for name in COGVIEW4_SIZES], dim=1).to(torch.bfloat16))),
            ("sizes_emb_h", Linear([condition.linear_1], "sizes")),
            ("sizes_emb_a", Exact(lambda v: condition.act_1(
                v["sizes_emb_h"]))),
            ("sizes_emb", Linear([condition.linear_2], "sizes_emb_a")),
            ("temb", Exact(lambda v: v["t_emb"] + v["sizes_emb"])),
            ("temb_silu", Exact(lambda v: torch.nn.functional.silu(
                v["temb"]))),
            ("block_mod", Linear(
                [b.norm1.linear for b in model.transformer_blocks],
                "temb_silu", stacked=True)),
            ("norm_out", Linear([model.norm_out.linear], "temb_silu")),
        ]


class MiniMaxH3(Family):
    """MiniMax-H3: the forward's distinct noise levels (here the shared
    timesteps as they are: the arithmetic does not depend on their range)
    embedded by the time MLP, which the checkpoint and from_pretrained keep
    in float32; every block's adaln_proj and the output norm's Linear read
    SiLU(temb) taken in float32 and only then cast to the model's dtype.
    One packed sequence holds a video, a text and an audio token per level.
    In bf16 the model is from_pretrained(torch_dtype=bf16) of a float32
    folder, as a user loads it (Wan's save)."""
    sinusoids = ("time_proj",)
    scalar_names = ("t_model",)
    float32_stage = ("time_embedder", "temb")

    def build(self, dtype):
        torch.manual_seed(43)
        return diffusers.MiniMaxH3Transformer3DModel(
            hidden_size=WIDTH, num_attention_heads=4,
            attention_head_dim=WIDTH // 4, num_layers=3, num_refiner_layers=1,
            ffn_dim=32, in_channels=4, audio_in_channels=4,
            patch_size=(1, 2, 2), text_dim=24, freq_dim=256,
            time_embed_hidden_dim=96, time_embed_dim=48,
            rope_freq_dim=4).eval()

    def save(self, dtype, folder):
        return save_as_loaded(self.build(dtype), dtype, folder)

    def modules(self, model):
        found = [("temb", None, model.time_embedder)]
        found += [("block_mod", i, block.adaln_proj.linear)
                  for i, block in enumerate(model.transformer_blocks)]
        return found + [("norm_out", None, model.norm_out.linear)]

    def inputs(self, dtype, t, generator):
        # Per level k a video, a text and an audio token, at packed
        # positions 3k, 3k + 1 and 3k + 2; the batch axis is one sequence.
        levels = t.shape[0]
        return self.packed(
            torch.randn(1, levels, 16, generator=generator).to(dtype),
            torch.randn(1, levels, 4, generator=generator).to(dtype),
            torch.randn(1, levels, 24, generator=generator).to(dtype),
            t.to(torch.float32))

    @staticmethod
    def packed(video, audio, text, t):
        levels = t.shape[0]
        positions = torch.arange(3 * levels)
        return dict(
            hidden_states=video, audio_hidden_states=audio,
            encoder_hidden_states=text, timestep=t,
            timestep_indices=positions // 3, token_tags=positions % 3,
            position_ids=torch.zeros(3 * levels, 3, dtype=torch.long),
            video_indices=positions[0::3], text_indices=positions[1::3],
            audio_indices=positions[2::3])

    def row_args(self, args, row):
        # The level's three tokens alone: a sequence of one level.
        level = slice(row, row + 1)
        return self.packed(args["hidden_states"][:, level],
                           args["audio_hidden_states"][:, level],
                           args["encoder_hidden_states"][:, level],
                           args["timestep"][level])

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0])]

    def op_checks(self, model):
        mlp = model.time_embedder
        silu = torch.nn.functional.silu
        return [
            ("t_sinus", Float32Sinusoid(model.time_proj, "t_model")),
            ("temb_h", Float32Linear(mlp.linear_1, "t_sinus")),
            ("temb_a", Float32(lambda v: mlp.act(v["temb_h"]), ulps=4)),
            ("temb", Float32Linear(mlp.linear_2, "temb_a")),
            ("temb_silu_f32", Float32(lambda v: silu(v["temb"]), ulps=4)),
            ("temb_silu",
             Exact(lambda v: v["temb_silu_f32"].to(torch.bfloat16))),
            ("block_mod", Linear(
                [b.adaln_proj.linear for b in model.transformer_blocks],
                "temb_silu", stacked=True)),
            ("norm_out", Linear([model.norm_out.linear], "temb_silu")),
        ]


class HiDream(Family):
    """HiDream-I1: FLUX-like per-block modulation (12D double-stream, 6D
    single-stream blocks, 2D final layer) of temb = the timestep MLP + the
    pooled embedding's MLP.  MoE feed-forwards of 2 experts, one active."""
    sinusoids = ("t_embedder.time_proj",)
    scalar_names = ("t_model",)
    pooled_argument = "pooled_embeds"

    def build(self, dtype):
        torch.manual_seed(14)
        model = diffusers.HiDreamImageTransformer2DModel(
            patch_size=2, in_channels=4, num_layers=2, num_single_layers=3,
            attention_head_dim=WIDTH // 4, num_attention_heads=4,
            caption_channels=[24, 24], text_emb_dim=POOLED,
            num_routed_experts=2, num_activated_experts=1,
            axes_dims_rope=(16, 24, 24), max_resolution=(8, 8),
            llama_layers=list(range(5)))
        return model.to(dtype).eval()

    def modules(self, model):
        found = [("temb", None, model.double_stream_blocks[0],
                  Argument("temb"))]
        found += [("double_mod", i, b.block.adaLN_modulation[1])
                  for i, b in enumerate(model.double_stream_blocks)]
        found += [("single_mod", i, b.block.adaLN_modulation[1])
                  for i, b in enumerate(model.single_stream_blocks)]
        return found + [("final_mod", None,
                         model.final_layer.adaLN_modulation[1])]

    def inputs(self, dtype, t, generator):
        # HiDreamImagePipeline: t.expand(B), the scheduler's float32 t;
        # one llama3 layer per block.
        batch = t.shape[0]
        return dict(
            hidden_states=torch.randn(batch, 4, 4, 4,
                                      generator=generator).to(dtype),
            timesteps=t,
            encoder_hidden_states_t5=torch.randn(
                batch, TEXT_TOKENS, 24, generator=generator).to(dtype),
            encoder_hidden_states_llama3=torch.randn(
                5, batch, TEXT_TOKENS, 24, generator=generator).to(dtype))

    def scalars(self, values, embedded):
        return [(values["t_model"], embedded[self.sinusoids[0]][0])]

    def op_checks(self, model):
        doubles = [b.block for b in model.double_stream_blocks]
        singles = [b.block for b in model.single_stream_blocks]
        checks = [("t_proj", Sinusoid(model.t_embedder.time_proj,
                                      "t_model"))]
        checks += mlp_checks("t_emb", model.t_embedder.timestep_embedder,
                             "t_proj")
        checks += mlp_checks("p_emb", model.p_embedder.pooled_embedder,
                             "pooled_model")
        return checks + [
            ("temb", Exact(lambda v: v["t_emb"] + v["p_emb"])),
            ("temb_silu",
             Exact(lambda v: doubles[0].adaLN_modulation[0](v["temb"]))),
            ("double_mod", Linear([b.adaLN_modulation[1] for b in doubles],
                                  "temb_silu", stacked=True)),
            ("single_mod", Linear([b.adaLN_modulation[1] for b in singles],
                                  "temb_silu", stacked=True)),
            ("final_mod", Linear([model.final_layer.adaLN_modulation[1]],
                                 "temb_silu")),
        ]


FAMILIES = {
    "qwen-image-layered": QwenLayered(),
    "wan": Wan(),
    "wan-bf16-stored": WanBf16Stored(),
    "pixart-sigma": PixArt(alpha=False),
    "pixart-alpha": PixArt(alpha=True),
    "cogvideox": CogVideoX(ofs=False),
    "cogvideox-1.5-i2v": CogVideoX(ofs=True),
    "ltx-video": Ltx(),
    "hidream-i1": HiDream(),
    "sana": Sana(),
    "sana-sprint": SanaSprint(),
    "z-image": ZImage(),
    "lumina2": Lumina2(),
    "hunyuanvideo": HunyuanVideo(),
    "hunyuanvideo-i2v": HunyuanVideoI2V(),
    "hunyuanvideo-token-replace": HunyuanVideoTokenReplace(),
    "hunyuanvideo-1.5-sr": HunyuanVideo15SR(),
    "chroma": Chroma(),
    "auraflow": AuraFlow(),
    "minimax-h3": MiniMaxH3(),
    "cogview4": CogView4(),
    "longcat-image": FluxTimeOnly(diffusers.LongCatImageTransformer2DModel,
                                  45, "time_embed.",
                                  {"pooled_projection_dim": 24}),
    "bria": Bria(),
    "hunyuanimage-2.1": HunyuanImage(),
    "hunyuanvideo-framepack": HunyuanVideoFramepack(),
    "motif-video": MotifVideo(),
    "bria-fibo": BriaFibo(),
    "ovis-image": FluxTimeOnly(diffusers.OvisImageTransformer2DModel, 46, "",
                               {"out_channels": 4}),
}

KINDS = ["qwen-image", "qwen-image-edit", "flux.1-dev", "flux.1-schnell", "sd3", "sd3.5",
         "hunyuanvideo-1.5", "flux.2-dev", "flux.2-klein", "sdxl-unet"] + \
    list(FAMILIES)
FP32_KINDS = [kind for kind in KINDS
              if kind not in FAMILIES or "fp32" in FAMILIES[kind].dtypes]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Shard sizes: small enough for several shards.
SHARDED = {"qwen-image": "30KB", "hunyuanvideo-1.5": "4MB",
           "flux.2-dev": "1MB", "sdxl-unet": "2MB"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{(kind, dtype name): (model, folder, pooled float32 [N, P])}."""
    folders = {}
    generator = torch.Generator().manual_seed(11)
    pooled = torch.randn(len(TIMESTEPS), POOLED, generator=generator)
    for kind in KINDS:
        for dtype_name, dtype in DTYPES.items():
            if kind in FAMILIES:
                if dtype_name in FAMILIES[kind].dtypes:
                    folder = tmp_path_factory.mktemp(f"{kind}-{dtype_name}")
                    folders[(kind, dtype_name)] = (
                        FAMILIES[kind].save(dtype, folder), folder,
                        pooled.to(dtype).to(torch.float32))
                continue
            model = build(kind, dtype)
            folder = tmp_path_factory.mktemp(f"{kind}-{dtype_name}")
            # The bf16 Qwen-Image model and the bf16 model of every family
            # added after it are saved in shards (index.json).
            shard = (SHARDED[kind] if dtype_name == "bf16" and kind in SHARDED
                     else "10GB")
            model.save_pretrained(folder, max_shard_size=shard)
            # The pooled embedding as the pipeline holds it: in the model's
            # dtype (written as the float32 holding that value).
            folders[(kind, dtype_name)] = (model, folder,
                                           pooled.to(dtype).to(torch.float32))
    for kind in SHARDED:
        index = folders[(kind, "bf16")][1] / \
            "diffusion_pytorch_model.safetensors.index.json"
        assert index.exists() and \
            len(set(json.loads(index.read_text())["weight_map"].values())) > 1
    # The bf16 Wan folder: shards, float32 kept modules beside bf16 ones.
    index = folders[("wan", "bf16")][1] / \
        "diffusion_pytorch_model.safetensors.index.json"
    assert len(set(json.loads(index.read_text())["weight_map"].values())) > 1
    return folders


def time_ids_file(kind, tmp_path, rows=slice(None)):
    """The SDXL UNet's time ids as a float32 .npy, or None."""
    if kind != "sdxl-unet":
        return None
    path = tmp_path / "time_ids.npy"
    np.save(path, np.array(TIME_IDS, dtype=np.float32)[rows])
    return path


def temb_outputs(temb_cli, kind, folder, pooled, tmp_path, flags=()):
    pooled_file = None
    if kind in POOLED_KINDS:
        pooled_file = tmp_path / "pooled.npy"
        np.save(pooled_file, pooled.numpy().astype(np.float32))
    return run_temb(temb_cli, folder, tmp_path / "out.safetensors", TIMESTEPS,
                    kind, pooled_file,
                    time_ids_file=time_ids_file(kind, tmp_path), flags=flags)


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_matches_diffusers_within_one_ulp(kind, saved, temb_cli,
                                               tmp_path, measure):
    model, folder, pooled = saved[(kind, "bf16")]
    compare_bf16(kind, model, folder, pooled, temb_cli, tmp_path, measure)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_the_forward_timestep_gives_the_scheduler_t_bits(
        kind, dtype_name, saved, temb_cli, tmp_path):
    """The transformer forward's timestep as the pipeline passes it
    (t / 1000 in bf16, 1 - t / 1000, ...), sent as it is instead of the
    scheduler's t, gives the same bits of every output: the model's
    description holds the pipeline's arithmetic in one place."""
    if (kind, dtype_name) not in saved:
        pytest.skip(f"{kind} has no {dtype_name} model")
    model, folder, pooled = saved[(kind, dtype_name)]
    args = model_inputs(kind, DTYPES[dtype_name], pooled)
    forward = next(args[name] for name in ("timestep", "timesteps", "t")
                   if name in args)
    pooled_file = None
    if kind in POOLED_KINDS:
        pooled_file = tmp_path / "pooled.npy"
        np.save(pooled_file, pooled.numpy().astype(np.float32))
    common = dict(kind=kind, pooled_file=pooled_file,
                  time_ids_file=time_ids_file(kind, tmp_path))
    by_t = run_temb(temb_cli, folder, tmp_path / "t.safetensors", TIMESTEPS,
                    **common)
    by_forward = run_temb(temb_cli, folder, tmp_path / "f.safetensors",
                          forward.float().tolist(), time_flag="timestep",
                          **common)
    assert sorted(by_forward) == sorted(by_t)
    for name, value in by_t.items():
        assert torch.equal(by_forward[name].view(torch.uint8),
                           value.view(torch.uint8)), name


def test_a_forward_timestep_the_forward_cannot_receive_is_refused(
        saved, temb_cli, tmp_path):
    """Qwen-Image's forward receives t / 1000 in bf16: 0.1 is no such value,
    and it is refused rather than rounded; t and timestep together are
    refused too."""
    _, folder, _ = saved[("qwen-image", "bf16")]
    out = f"--out={tmp_path / 'x.safetensors'}"
    code, err = run_failing(temb_cli, f"--model_dir={folder}",
                            "--timestep=0.5,0.1", out)
    assert code == 1 and "timestep[1] = 0.1 is not a bf16 value" in err
    code, err = run_failing(temb_cli, f"--model_dir={folder}",
                            "--timestep=0.5", "--timesteps=500", out)
    assert code == 2 and "one of --timesteps and --timestep" in err
    code, err = run_failing(temb_cli, f"--model_dir={folder}",
                            "--timestep=0.5", "--outputs=t_pipeline", out)
    assert code == 1 and '"t_pipeline" is computed from t' in err


def from_pretrained_bf16(kind, folder):
    """The model a pipeline holds after from_pretrained(folder,
    torch_dtype=bf16): every tensor converted, the kept modules to
    float32."""
    if importlib.util.find_spec("accelerate") is None:
        pytest.fail("accelerate is required: from_pretrained(torch_dtype) "
                    "needs it (scripts/requirements-dev.txt)")
    cls = diffusers.WanTransformer3DModel if kind == "wan" else \
        diffusers.QwenImageTransformer2DModel
    return cls.from_pretrained(folder, torch_dtype=torch.bfloat16).eval()


# Wan has kept modules (_keep_in_fp32_modules); Qwen-Image has none, so
# every tensor it reads is converted.
@pytest.mark.parametrize("kind", ["wan", "qwen-image"])
def test_fp32_folder_under_torch_dtype_bf16_matches_from_pretrained(
        kind, saved, temb_cli, tmp_path, measure):
    _, folder, pooled = saved[(kind, "fp32")]
    model = from_pretrained_bf16(kind, folder)
    dtypes = {name: param.dtype for name, param in model.named_parameters()}
    if kind == "wan":
        kept = ("condition_embedder.time_embedder.linear_1.weight",
                "blocks.0.scale_shift_table", "scale_shift_table")
        assert all(dtypes[name] == torch.float32 for name in kept)
        assert dtypes["condition_embedder.time_proj.weight"] == torch.bfloat16
    else:
        assert set(dtypes.values()) == {torch.bfloat16}
    compare_bf16(kind, model, folder, pooled.to(torch.bfloat16).float(),
                 temb_cli, tmp_path, measure, flags=("--torch_dtype=bf16",))


def test_folder_file_sets_torch_dtype_and_the_flag_overrides_it(
        saved, temb_cli, tmp_path):
    _, folder, _ = saved[("qwen-image", "fp32")]
    with_file = tmp_path / "with-file"
    with_file.mkdir()
    for item in folder.iterdir():
        (with_file / item.name).symlink_to(item)
    (with_file / "temb.json").write_text('{"torch_dtype": "bfloat16"}')

    def run(where, name, *flags):
        return run_temb(temb_cli, where, tmp_path / name, TIMESTEPS,
                        "qwen-image", flags=flags)

    by_flag = run(folder, "flag.safetensors", "--torch_dtype=bf16")
    by_file = run(with_file, "file.safetensors")
    stored = run(folder, "stored.safetensors")
    overridden = run(with_file, "overridden.safetensors", "--torch_dtype=fp32")
    for name, value in by_flag.items():
        assert value.dtype == torch.bfloat16, name
        assert torch.equal(by_file[name].view(torch.int16),
                           value.view(torch.int16)), name
        assert stored[name].dtype == torch.float32, name
        assert torch.equal(overridden[name].view(torch.int32),
                           stored[name].view(torch.int32)), name
    # Refusals name the file and the field, or the flag.
    out = f"--out={tmp_path / 'x.safetensors'}"
    (with_file / "temb.json").write_text('{"torch_dtype": "float8"}')
    code, err = run_failing(temb_cli, f"--model_dir={with_file}",
                            "--timesteps=1", out)
    assert code == 1 and "temb.json: field torch_dtype" in err and \
        '"float8"' in err
    (with_file / "temb.json").write_text('{"dtype": "bfloat16"}')
    code, err = run_failing(temb_cli, f"--model_dir={with_file}",
                            "--timesteps=1", out)
    assert code == 1 and 'temb.json: field "dtype": unknown' in err
    code, err = run_failing(temb_cli, f"--model_dir={folder}",
                            "--timesteps=1", "--torch_dtype=fp64", out)
    assert code == 1 and "--torch_dtype: must be one of" in err


def compare_bf16(kind, model, folder, pooled, temb_cli, tmp_path, measure,
                 flags=()):
    """temb on `folder` (with `flags`) against `model`'s own bf16 forward:
    within one bf16 ulp, where PyTorch moves as far under another
    summation order, measured and recorded."""
    args = model_inputs(kind, torch.bfloat16, pooled)
    theirs = capture(kind, model, args)
    second_orders = {
        "float64-summed Linears":
            capture_with_linears_in(torch.float64, kind, model, args),
        "float32-summed Linears":
            capture_with_linears_in(torch.float32, kind, model, args),
        "one row at a time": capture_row_by_row(kind, model, args),
        "Linears summed over k reversed":
            capture_with_linears_reversed(kind, model, args),
    }
    if kind in FAMILIES and FAMILIES[kind].float32_stage:
        # A float32 module whose output is rounded to bf16 (Wan's
        # time_embedder, then .type_as): two float32 summation orders put
        # that value on either side of a bf16 rounding boundary now and
        # then, and a cancelling sum downstream moves by many ulps.  The
        # float32 module itself is held to the float32 summation bound op
        # by op; here PyTorch is run from temb's float32 output of it.
        module_name, value = FAMILIES[kind].float32_stage
        stage = run_temb(temb_cli, folder, tmp_path / "stage.safetensors",
                         TIMESTEPS, kind, outputs=[value],
                         flags=flags)[value]
        module = dict(model.named_modules())[module_name]
        handle = module.register_forward_hook(lambda *_: stage.clone())
        try:
            second_orders["from temb's float32 " + value] = \
                capture(kind, model, args)
        finally:
            handle.remove()
    bounds = summation_bounds(kind, model, args)
    ours = temb_outputs(temb_cli, kind, folder, pooled, tmp_path, flags)
    assert sorted(ours) == sorted(theirs)
    total = differ = beyond_one = by_bound = by_ops = 0
    ops_hold = None  # checked op by op only where needed
    worst = 0
    worst_relative = 0.0  # |temb - diffusers| / max |output|, per output
    equal_to = {label: 0 for label in second_orders}
    table_sources = FAMILIES[kind].table_sources if kind in FAMILIES else {}
    for name, expected in theirs.items():
        got = ours[name]
        assert got.dtype == expected.dtype, name
        assert got.shape == expected.shape, name
        stage = (FAMILIES[kind].float32_stage if kind in FAMILIES
                 else None)
        if expected.dtype == torch.float32 and stage and name == stage[1]:
            # The float32 module's own output (MiniMax-H3's temb): two
            # float32 summation orders, held to the float32 summation
            # bound op by op (test_bf16_each_op_matches_its_diffusers_
            # module); here within 2^-16 of its largest value.
            error = (got.double() - expected.double()).abs()
            assert float(error.max()) <= 2.0 ** -16 * float(
                expected.double().abs().max()), name
            total += got.numel()
            differ += int((got != expected).sum())
            for label, other in second_orders.items():
                equal_to[label] += int((got == other[name]).sum())
            continue
        if expected.dtype == torch.float32:
            # A float32 table plus a bf16 value (Wan): the float32 sum
            # differs only where the bf16 addend does, by that much (and
            # the sum's own rounding).
            source = table_sources[name]
            moved = (ours[source].double() -
                     theirs[source].double()).abs().unsqueeze(1)
            error = (got.double() - expected.double()).abs()
            slack = torch.abs(expected.double()) * 2.0 ** -23
            assert bool((error <= moved + slack).all()), (
                f"{name}: further from diffusers than its bf16 addend "
                f"{source} is")
            total += got.numel()
            differ += int((got != expected).sum())
            for label, other in second_orders.items():
                equal_to[label] += int((got == other[name]).sum())
            continue
        distance = bf16_ulp_distance(got, expected)
        pytorch_move = torch.stack([
            bf16_ulp_distance(other[name], expected)
            for other in second_orders.values()]).max(dim=0).values
        total += distance.numel()
        differ += int((distance > 0).sum())
        beyond_one += int((distance > 1).sum())
        worst = max(worst, int(distance.max()))
        worst_relative = max(worst_relative, float(
            (got.double() - expected.double()).abs().max() /
            expected.double().abs().max()))
        for label, other in second_orders.items():
            equal_to[label] += int((bf16_ulp_distance(got, other[name]) == 0)
                                   .sum())
        # Where the three orders above happen to round as PyTorch's GEMM
        # does, a cancelling sum can still be two orders apart: such an
        # element passes when the gap is within the float32 summation bound
        # of the Linear computing it, fed diffusers' own input.  At 2+ ulp
        # that holds only where the sum cancels (|y| below the bound).
        gap = (got.double() - expected.double()).abs()
        ulp = expected.double().abs() * 2.0 ** -7 + 2.0 ** -133
        within_bound = gap <= bounds[name] + ulp if name in bounds else \
            torch.zeros_like(distance, dtype=torch.bool)
        beyond_orders = (distance > 1) & (distance > pytorch_move)
        by_bound += int((beyond_orders & within_bound).sum())
        unexplained = beyond_orders & ~within_bound
        if bool(unexplained.any()) and ops_hold is None:
            # Failing those: does every op hold its own rule, fed temb's
            # inputs?  Then the gap is other summation orders' rounding
            # carried along the chain (asserted inside; raises if not).
            try:
                check_each_op(kind, model, folder, pooled, temb_cli,
                              tmp_path, flags)
                ops_hold = True
            except AssertionError as error:
                ops_hold = str(error)
        assert not bool(unexplained.any()) or ops_hold is True, (
            f"{name}: {int(unexplained.sum())} elements more than one bf16 ulp "
            f"from diffusers where PyTorch itself moves less under another "
            f"summation order, the gap is above the float32 summation "
            f"bound (max {int(distance.max())} ulp) and an op is beyond its "
            f"own rule: {ops_hold}")
        by_ops += int(unexplained.sum())
    measure("bf16 elements differing from diffusers",
            f"{differ} of {total} ({100.0 * differ / total:.2f}%; "
            f"{100.0 * (total - differ) / total:.2f}% bit-equal), max {worst}"
            f" ulp, {beyond_one} beyond 1 ulp (each where PyTorch moves as "
            f"far, or {by_bound} within the float32 summation bound, or "
            f"{by_ops} where every op holds its rule fed temb's inputs); "
            f"largest "
            f"difference {worst_relative:.2g} of the output's largest "
            f"magnitude")
    measure("bf16 elements equal to PyTorch under another order",
            ", ".join(f"{label}: {count} of {total}"
                      for label, count in equal_to.items()))


class Exact:
    """An element-wise op: diffusers' result must be temb's, bit for bit."""

    def __init__(self, compute):
        self.compute = compute

    def check(self, value, values):
        expected = self.compute(values)
        distance = bf16_ulp_distance(values[value], expected)
        assert int(distance.max()) == 0, (
            f"{value}: {int((distance > 0).sum())} elements differ from "
            "diffusers' module fed temb's inputs")
        return "0"


class Sinusoid:
    """diffusers' own Timesteps module on temb's rounded timesteps, cast to
    bf16 as the model casts it: the sin/cos engines differ, within one
    ulp after the cast."""

    def __init__(self, module, source, flatten=False):
        self.module, self.source, self.flatten = module, source, flatten

    def check(self, value, values):
        x = values[self.source]
        if self.flatten:  # [N, k]: each element's sinusoid, side by side
            expected = self.module(x.flatten()).reshape(x.shape[0], -1)
        else:
            expected = self.module(x)
        expected = expected.to(torch.bfloat16)
        distance = bf16_ulp_distance(values[value], expected)
        assert int(distance.max()) <= 1, value
        return str(int((distance > 0).sum()))


class Linear:
    """diffusers' Linear module(s) (one per block for a stacked value) fed
    temb's input.  Two float32 summation orders of K terms differ by at most
    2 K 2^-24 sum |x_k w_k| before rounding to bf16, so an element passes
    within one bf16 ulp, or within that bound plus one ulp where the sum
    cancels."""

    def __init__(self, modules, source, stacked=False, shape=None, groups=1):
        self.modules, self.source, self.stacked = modules, source, stacked
        self.shape = shape  # the row's shape as the model reshapes it
        self.groups = groups  # rows of the Linear per row of the value

    def check(self, value, values):
        x = values[self.source]
        if self.groups > 1:
            got = values[value]
            values = dict(values)
            values[value] = got.reshape(got.shape[0] * self.groups, -1)
            x = x.reshape(x.shape[0] * self.groups, -1)
        outs, bounds = [], []
        for module in self.modules:
            outs.append(module(x))
            terms = torch.nn.functional.linear(
                x.double().abs(), module.weight.double().abs())
            bounds.append(2 * x.shape[-1] * 2.0 ** -24 * terms)
        if self.shape is not None:
            outs = [out.unflatten(-1, self.shape) for out in outs]
            bounds = [bound.unflatten(-1, self.shape) for bound in bounds]
        stack = (lambda t: torch.stack(t, dim=1)) if self.stacked else \
            (lambda t: t[0])
        expected, bound = stack(outs), stack(bounds)
        got = values[value]
        distance = bf16_ulp_distance(got, expected)
        ulp = torch.abs(expected.double()) * 2.0 ** -7 + 2.0 ** -133
        beyond = (distance > 1) & \
            ((got.double() - expected.double()).abs() > bound + ulp)
        assert not bool(beyond.any()), (
            f"{value}: {int(beyond.sum())} elements beyond one ulp and the "
            "float32 summation bound of diffusers' module fed temb's input")
        differ = int((distance > 0).sum())
        cancels = int((distance > 1).sum())
        return f"{differ} ({cancels} by 2+ ulp)" if cancels else str(differ)


def float32_ulps(got, expected, floor=0.0):
    """|got - expected| in float32 ulps (2^-23 relative) of the expected
    value's magnitude, or of `floor` where that is larger."""
    scale = torch.clamp(torch.abs(expected.double()), min=floor)
    ulp = scale * 2.0 ** -23 + 2.0 ** -149
    return (got.double() - expected.double()).abs() / ulp


class Float32:
    """An op diffusers computes in float32 (Wan's kept modules, its table
    sums), checked against diffusers' own module or expression fed temb's
    inputs: bit for bit where both round one exact result (a sum), within
    `ulps` float32 ulps (of the value, or of `floor` where that is larger)
    where the engines differ (exp)."""

    def __init__(self, compute, ulps=0, floor=0.0):
        self.compute, self.ulps, self.floor = compute, ulps, floor

    def check(self, value, values):
        expected = self.compute(values)
        got = values[value]
        assert got.dtype == torch.float32 and got.shape == expected.shape
        distance = float32_ulps(got, expected, self.floor)
        assert float(distance.max()) <= self.ulps, (
            f"{value}: {float(distance.max()):.3g} float32 ulps from "
            "diffusers' module fed temb's inputs")
        return str(int((got != expected).sum()))


class Float32Sinusoid:
    """A float32 sinusoid kept in float32 (Wan's, into its float32
    time_embedder): the angles t * freq of large t carry float32 rounding
    in both engines, so the check is the fp32 contract's: temb's largest
    error against the float64 sinusoid of the same t is at most twice that
    of diffusers' module."""

    def __init__(self, module, source):
        self.module, self.source = module, source

    def check(self, value, values):
        x = values[self.source]
        theirs = self.module(x)
        exact = float64_timesteps(self.module, x)
        got = values[value]
        assert got.dtype == torch.float32 and got.shape == theirs.shape
        temb_error = float((got.double() - exact).abs().max())
        torch_error = float((theirs.double() - exact).abs().max())
        assert temb_error <= 2 * torch_error, (
            f"{value}: error {temb_error:.3g} against float64 is above twice "
            f"diffusers' {torch_error:.3g}")
        return str(int((got != theirs).sum()))


class Float32Linear:
    """A float32 Linear of diffusers fed temb's input: within the float32
    summation error bound of two orders, 2 K 2^-24 sum |x_k w_k|, plus one
    ulp of rounding."""

    def __init__(self, module, source):
        self.module, self.source = module, source

    def check(self, value, values):
        x = values[self.source]
        expected = self.module(x)
        bound = 2 * x.shape[-1] * 2.0 ** -24 * torch.nn.functional.linear(
            x.double().abs(), self.module.weight.double().abs())
        got = values[value]
        error = (got.double() - expected.double()).abs()
        ulp = torch.abs(expected.double()) * 2.0 ** -23
        assert bool((error <= bound + ulp).all()), (
            f"{value}: beyond the float32 summation bound of diffusers' "
            "module fed temb's input")
        return str(int((got != expected).sum()))


class WithinOneUlp:
    """A value computed by diffusers from temb's inputs through a sinusoid
    (its sin/cos engine differs): within one bf16 ulp."""

    def __init__(self, compute):
        self.compute = compute

    def check(self, value, values):
        distance = bf16_ulp_distance(values[value], self.compute(values))
        assert int(distance.max()) <= 1, value
        return str(int((distance > 0).sum()))


def sdxl_op_checks(model):
    """op_checks() for the SDXL UNet: get_time_embed, get_aug_embed and every
    resnet's time_emb_proj, fed temb's values."""
    def mlp(prefix, module, source):
        return [
            (f"{prefix}_h", Linear([module.linear_1], source)),
            (f"{prefix}_a", Exact(lambda v: module.act(v[f"{prefix}_h"]))),
            (prefix, Linear([module.linear_2], f"{prefix}_a")),
        ]

    def add_in(v):
        # get_aug_embed's concat of the pooled embedding (model dtype) with
        # add_time_proj of the flattened ids (float32), then .to(emb.dtype).
        ids = v["time_ids_model"]
        embedded = model.add_time_proj(ids.flatten()).reshape(ids.shape[0], -1)
        return torch.concat([v["pooled_model"], embedded],
                            dim=-1).to(torch.bfloat16)

    resnet = model.down_blocks[0].resnets[0]
    checks = [("t_proj", Sinusoid(model.time_proj, "t_model"))]
    checks += mlp("t_emb", model.time_embedding, "t_proj")
    checks += [("add_in", WithinOneUlp(add_in))]
    checks += mlp("aug_emb", model.add_embedding, "add_in")
    checks += [
        ("temb", Exact(lambda v: v["t_emb"] + v["aug_emb"])),
        ("temb_silu", Exact(lambda v: resnet.nonlinearity(v["temb"]))),
    ]
    by_output = {}
    for name, _, module in conditioning_modules("sdxl-unet", model)[1:]:
        by_output.setdefault(name, []).append(module)
    for name, modules in by_output.items():
        checks.append((name, Linear(modules, "temb_silu", stacked=True)))
    return checks


def op_checks(kind, model):
    """(temb value, check against the diffusers module computing it from
    temb's values) for every op of the family after the scalars, in
    order.  The value names are those of server/models/families/."""
    if kind in FAMILIES:
        return FAMILIES[kind].op_checks(model)
    embed = time_embedding(kind, model)
    if kind == "sdxl-unet":
        return sdxl_op_checks(model)
    blocks = model.transformer_blocks

    def mlp(prefix, module, source, act):
        return [
            (f"{prefix}_h", Linear([module.linear_1], source)),
            (f"{prefix}_a",
             Exact(lambda v: getattr(module, act)(v[f"{prefix}_h"]))),
            (prefix, Linear([module.linear_2], f"{prefix}_a")),
        ]

    # AdaLayerNormContinuous: linear(silu(temb).to(x.dtype)); temb_silu is
    # checked against the block's own SiLU just before.
    norm_out = ("norm_out", Linear([model.norm_out.linear], "temb_silu"))
    if kind.startswith("qwen-image"):
        return ([("t_proj", Sinusoid(embed.time_proj, "t_model"))] +
                mlp("t_emb", embed.timestep_embedder, "t_proj", "act") + [
                    ("temb", Exact(lambda v: v["t_emb"])),
                    ("temb_silu",
                     Exact(lambda v: blocks[0].img_mod[0](v["temb"]))),
                    ("img_mod", Linear([b.img_mod[1] for b in blocks],
                                       "temb_silu", stacked=True)),
                    ("txt_mod", Linear([b.txt_mod[1] for b in blocks],
                                       "temb_silu", stacked=True)),
                    norm_out,
                ])
    if kind == "hunyuanvideo-1.5":
        return ([("t_proj", Sinusoid(embed.time_proj, "t_model"))] +
                mlp("temb", embed.timestep_embedder, "t_proj", "act") + [
                    ("temb_silu",
                     Exact(lambda v: blocks[0].norm1.silu(v["temb"]))),
                    ("img_mod", Linear([b.norm1.linear for b in blocks],
                                       "temb_silu", stacked=True)),
                    ("txt_mod", Linear([b.norm1_context.linear
                                        for b in blocks],
                                       "temb_silu", stacked=True)),
                    norm_out,
                ])
    checks = [("t_proj", Sinusoid(embed.time_proj, "t_model"))]
    checks += mlp("t_emb", embed.timestep_embedder, "t_proj", "act")
    if kind.startswith("flux.2"):
        if kind == "flux.2-dev":
            checks.append(("g_proj", Sinusoid(embed.time_proj, "g_model")))
            checks += mlp("g_emb", embed.guidance_embedder, "g_proj", "act")
            checks.append(("temb", Exact(lambda v: v["t_emb"] + v["g_emb"])))
        else:
            checks.append(("temb", Exact(lambda v: v["t_emb"])))
        mod = model.double_stream_modulation_img
        return checks + [
            ("temb_silu", Exact(lambda v: mod.act_fn(v["temb"]))),
            ("img_mod", Linear([mod.linear], "temb_silu")),
            ("txt_mod", Linear([model.double_stream_modulation_txt.linear],
                               "temb_silu")),
            ("single_mod", Linear([model.single_stream_modulation.linear],
                                  "temb_silu")),
            norm_out,
        ]
    if kind.startswith("sd3"):
        by_output = {}
        for name, _, module in conditioning_modules(kind, model)[1:]:
            by_output.setdefault(name, []).append(module)
        checks += mlp("p_emb", embed.text_embedder, "pooled_model", "act_1")
        checks += [
            ("temb", Exact(lambda v: v["t_emb"] + v["p_emb"])),
            ("temb_silu", Exact(lambda v: blocks[0].norm1.silu(v["temb"]))),
        ]
        for name in ["img_mod", "img_mod_dual", "txt_mod"]:
            if name in by_output:
                checks.append((name, Linear(by_output[name], "temb_silu",
                                            stacked=True)))
        checks += [
            ("txt_mod_last", Linear(by_output["txt_mod_last"], "temb_silu")),
            norm_out,
        ]
        return checks
    if kind == "flux.1-dev":
        checks.append(("g_proj", Sinusoid(embed.time_proj, "g_model")))
        checks += mlp("g_emb", embed.guidance_embedder, "g_proj", "act")
        checks.append(("tg_emb", Exact(lambda v: v["t_emb"] + v["g_emb"])))
    checks += mlp("p_emb", embed.text_embedder, "pooled_model", "act_1")
    checks += [
        ("temb", Exact(lambda v: v["tg_emb"] + v["p_emb"])),
        ("temb_silu", Exact(lambda v: blocks[0].norm1.silu(v["temb"]))),
        ("img_mod", Linear([b.norm1.linear for b in blocks], "temb_silu",
                           stacked=True)),
        ("txt_mod", Linear([b.norm1_context.linear for b in blocks],
                           "temb_silu", stacked=True)),
        ("single_mod", Linear([b.norm.linear
                               for b in model.single_transformer_blocks],
                              "temb_silu", stacked=True)),
        norm_out,
    ]
    return checks


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_each_op_matches_its_diffusers_module(kind, saved, temb_cli,
                                                   tmp_path, measure):
    model, folder, pooled = saved[(kind, "bf16")]
    measure("bf16 ops: elements differing from diffusers' module",
            check_each_op(kind, model, folder, pooled, temb_cli, tmp_path))


def check_each_op(kind, model, folder, pooled, temb_cli, tmp_path, flags=()):
    """Every op of temb's description, fed temb's own inputs, against the
    diffusers module computing it (op_checks); asserts each within its
    rule and returns how many elements differ, op by op."""
    args = model_inputs(kind, torch.bfloat16, pooled)
    checks = op_checks(kind, model)
    if kind in FAMILIES:
        # What each Timesteps module receives, bit for bit.
        family = FAMILIES[kind]
        names = list(family.scalar_names) + [value for value, _ in checks]
        pooled_file = None
        if kind in POOLED_KINDS:
            pooled_file = tmp_path / "pooled.npy"
            np.save(pooled_file, pooled.numpy().astype(np.float32))
            names.append("pooled_model")
        values = run_temb(temb_cli, folder, tmp_path / "ops.safetensors",
                          TIMESTEPS, kind, pooled_file,
                          outputs=sorted(set(names)), flags=flags)
        if kind in POOLED_KINDS:
            assert torch.equal(values["pooled_model"],
                               pooled.to(torch.bfloat16))
        embedded = sinusoid_calls(kind, model, args)
        for ours, theirs in family.scalars(values, embedded):
            assert ours.dtype == theirs.dtype
            assert torch.equal(ours.flatten().view(torch.int16),
                               theirs.flatten().view(torch.int16))
        summary = []
        with torch.no_grad():
            for value, check in checks:
                summary.append(f"{value} {check.check(value, values)}")
        return ", ".join(summary)
    # What the model's time_proj receives: the pipeline's and the model's
    # rounding of t (and guidance) must be reproduced bit for bit.
    embedded = time_proj_inputs(kind, model, args)
    if kind == "qwen-image-edit":
        # t, then t * 0: the second half is +0 bit for bit, the timestep
        # 0 that a caller asks temb for.
        stacked = embedded[0]
        assert not bool(stacked[len(TIMESTEPS):].view(torch.int16).any())
        embedded = [first_half(stacked)]
    scalars = ["t_model"] + (["g_model"] if kind in GUIDED_KINDS else [])
    names = scalars + [value for value, _ in checks]
    if kind.startswith("flux.1"):
        names += ["pooled_model", "tg_emb"]
    elif kind.startswith("sd3"):
        names += ["pooled_model"]
    pooled_file = None
    if kind in POOLED_KINDS:
        pooled_file = tmp_path / "pooled.npy"
        np.save(pooled_file, pooled.numpy().astype(np.float32))
    if kind == "sdxl-unet":
        names += ["pooled_model", "time_ids_model"]
    values = run_temb(temb_cli, folder, tmp_path / "ops.safetensors",
                      TIMESTEPS, kind, pooled_file, outputs=sorted(set(names)),
                      time_ids_file=time_ids_file(kind, tmp_path), flags=flags)
    for scalar, theirs in zip(scalars, embedded):
        assert torch.equal(values[scalar].view(torch.int16),
                           theirs.view(torch.int16)), scalar
    if kind in POOLED_KINDS:
        assert torch.equal(values["pooled_model"], pooled.to(torch.bfloat16))
    if kind == "sdxl-unet":
        assert torch.equal(values["time_ids_model"],
                           torch.tensor(TIME_IDS).to(torch.bfloat16))
    summary = []
    with torch.no_grad():
        for value, check in checks:
            summary.append(f"{value} {check.check(value, values)}")
    return ", ".join(summary)


@pytest.mark.parametrize("kind", FP32_KINDS)
def test_fp32_error_within_twice_pytorch(kind, saved, temb_cli, tmp_path,
                                         measure):
    model, folder, pooled = saved[(kind, "fp32")]
    args = model_inputs(kind, torch.float32, pooled)
    theirs = capture(kind, model, args)
    reference = float64_reference(kind, model, args)
    ours = temb_outputs(temb_cli, kind, folder, pooled, tmp_path)
    summary = []
    for name, expected in theirs.items():
        got = ours[name]
        assert got.dtype == torch.float32 and got.shape == expected.shape
        ref = reference[name]
        torch_error = float((expected.double() - ref).abs().max())
        temb_error = float((got.double() - ref).abs().max())
        summary.append(f"{name} {temb_error:.3g}/{torch_error:.3g}")
        assert temb_error <= 2 * torch_error, (
            f"{name}: temb's error {temb_error:.3g} against float64 is above "
            f"twice PyTorch's {torch_error:.3g}")
    measure("fp32 max error vs float64, temb/pytorch", ", ".join(summary))


def full_img_mod(model, args):
    """Every block's img_mod output as the forward computed it: [rows, L,
    6D], all the rows the block saw."""
    outputs = {}
    handles = [block.img_mod[1].register_forward_hook(
        lambda _m, _i, output, i=i: outputs.__setitem__(i, output.detach()))
        for i, block in enumerate(model.transformer_blocks)]
    run_hooked(model, args, handles)
    return torch.stack([outputs[i] for i in sorted(outputs)], dim=1)


def test_zero_cond_t_reference_rows_are_the_rows_at_zero(saved, temb_cli,
                                                          tmp_path, measure):
    """Qwen-Image-Edit-2511 (zero_cond_t): the second half of every block's
    img_mod, which the reference image's tokens read, is the row temb
    serves for timestep 0.  bf16: within one ulp of it (the fraction equal
    recorded); fp32: within twice PyTorch's own error against the float64
    model, whose input at t = 0 (cos 0 = 1, sin 0 = 0) is exact."""
    batch = len(TIMESTEPS)
    summary = []
    for dtype_name, dtype in DTYPES.items():
        model, folder, _ = saved[("qwen-image-edit", dtype_name)]
        args = model_inputs("qwen-image-edit", dtype, None)
        rows = full_img_mod(model, args)
        assert rows.shape[0] == 2 * batch
        theirs = rows[batch:]
        served = run_temb(temb_cli, folder, tmp_path / f"zero-{dtype_name}"
                          ".safetensors", [0.0], "qwen-image-edit",
                          outputs=["img_mod"])["img_mod"]
        ours = served.expand_as(theirs)
        if dtype == torch.bfloat16:
            distance = bf16_ulp_distance(ours, theirs)
            assert int(distance.max()) <= 1, int(distance.max())
            equal = int((distance == 0).sum())
            summary.append(f"bf16 {equal} of {distance.numel()} bit-equal")
            continue
        model64 = copy.deepcopy(model).to(torch.float64)
        args64 = {k: v.to(torch.float64) if torch.is_tensor(v) and
                  v.is_floating_point() else v for k, v in args.items()}
        reference = full_img_mod(model64, args64)[batch:]
        torch_error = float((theirs.double() - reference).abs().max())
        temb_error = float((ours.double() - reference).abs().max())
        assert temb_error <= 2 * torch_error, (temb_error, torch_error)
        summary.append(f"fp32 error {temb_error:.3g}, PyTorch's "
                       f"{torch_error:.3g}")
    measure("zero_cond_t: reference rows against the row at 0",
            "; ".join(summary))


@pytest.mark.parametrize("kind", ["qwen-image", "flux.1-dev", "sd3.5", "wan",
                                  "pixart-alpha", "cogvideox-1.5-i2v",
                                  "sdxl-unet", "hunyuanvideo-framepack",
                                  "motif-video", "bria-fibo"])
def test_rows_are_batch_invariant(kind, saved, temb_cli, tmp_path):
    _, folder, pooled = saved[(kind, "bf16")]
    batch = temb_outputs(temb_cli, kind, folder, pooled, tmp_path)
    for row, t in enumerate(TIMESTEPS[:4]):
        pooled_file = None
        if kind in POOLED_KINDS:
            pooled_file = tmp_path / f"pooled{row}.npy"
            np.save(pooled_file, pooled[row].numpy().astype(np.float32))
        alone = run_temb(temb_cli, folder, tmp_path / f"row{row}.safetensors",
                         [t], kind, pooled_file,
                         time_ids_file=time_ids_file(kind, tmp_path,
                                                     slice(row, row + 1)))
        for name, values in alone.items():
            assert torch.equal(values[0].view(torch.int16),
                               batch[name][row].view(torch.int16)), (name, row)


def test_repeated_calls_hit_the_row_cache(saved, temb_cli, tmp_path):
    """Nine timesteps with one repeat: 8 distinct rows, computed on the first
    call and found on the next two; the answer is the uncached one."""
    _, folder, _ = saved[("qwen-image", "bf16")]
    timesteps = ",".join(repr(t) for t in TIMESTEPS)
    fresh = run_temb(temb_cli, folder, tmp_path / "fresh.safetensors",
                     TIMESTEPS, "qwen-image")
    done = subprocess.run(
        [str(temb_cli), "condition", f"--model_dir={folder}",
         f"--timesteps={timesteps}", f"--out={tmp_path / 'cached.safetensors'}",
         "--repeat=3", f"--device={DEVICE}"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "run 1: " in done.stderr and "(cache: 0 hits, 8 misses" in done.stderr
    assert "run 3: " in done.stderr and "(cache: 16 hits, 8 misses" in done.stderr
    cached = safetensors_torch.load_file(str(tmp_path / "cached.safetensors"))
    for name, values in fresh.items():
        assert torch.equal(values.view(torch.int16),
                           cached[name].view(torch.int16)), name


def run_failing(temb_cli, *flags):
    done = subprocess.run([str(temb_cli), "condition", *flags],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


def test_cli_refuses_bad_requests_naming_the_cause(saved, temb_cli, tmp_path):
    _, qwen, _ = saved[("qwen-image", "bf16")]
    _, flux, _ = saved[("flux.1-dev", "bf16")]
    out = f"--out={tmp_path / 'x.safetensors'}"
    code, err = run_failing(temb_cli, f"--model_dir={qwen}", "--timesteps=1",
                            "--guidance=3.5", out)
    assert code == 1 and ("guidance: not an input of qwen-image "
                          "(t, addition_t_cond, timestep)") in err
    code, err = run_failing(temb_cli, f"--model_dir={qwen}", "--timesteps=1")
    assert code == 2 and "--out is required" in err
    narrow = tmp_path / "narrow.npy"
    np.save(narrow, np.zeros(7, dtype=np.float32))
    code, err = run_failing(temb_cli, f"--model_dir={flux}", "--timesteps=1",
                            "--guidance=3.5", f"--pooled={narrow}", out)
    assert code == 1 and f"pooled: expected {POOLED} or {POOLED} values" in err
    code, err = run_failing(temb_cli, f"--model_dir={flux}", "--timesteps=1",
                            f"--pooled={narrow}", out)
    assert code == 1 and "guidance: required by this flux.1 model" in err
    # A damaged shard: cut short inside its header.
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for item in qwen.iterdir():
        (damaged / item.name).write_bytes(item.read_bytes())
    shard = sorted(damaged.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:64])
    code, err = run_failing(temb_cli, f"--model_dir={damaged}", "--timesteps=1",
                            out)
    assert code == 1 and shard.name in err and "header length" in err
    # SD3.5: a dual-attention block index past the last block.
    _, sd35, _ = saved[("sd3.5", "bf16")]
    past = tmp_path / "past"
    past.mkdir()
    for item in sd35.iterdir():
        (past / item.name).write_bytes(item.read_bytes())
    config = json.loads((past / "config.json").read_text())
    config["dual_attention_layers"] = [0, 3]
    (past / "config.json").write_text(json.dumps(config))
    code, err = run_failing(temb_cli, f"--model_dir={past}", "--timesteps=1",
                            out)
    assert code == 1 and "field dual_attention_layers" in err
    # The other inputs by name: malformed, given to a model without them,
    # missing where the config asks for them.
    _, alpha, _ = saved[("pixart-alpha", "bf16")]
    _, sigma, _ = saved[("pixart-sigma", "bf16")]
    code, err = run_failing(temb_cli, f"--model_dir={alpha}", "--timesteps=1",
                            "--inputs=resolution", out)
    assert code == 1 and "--inputs: 'resolution' is not name=values" in err
    code, err = run_failing(temb_cli, f"--model_dir={alpha}", "--timesteps=1",
                            "--inputs=resolution=1024,x", out)
    assert code == 1 and "--inputs: resolution: " in err and "'x'" in err
    code, err = run_failing(temb_cli, f"--model_dir={alpha}", "--timesteps=1",
                            "--inputs=resolution=1024,1024,1024", out)
    assert code == 1 and "resolution: expected 2 or 2 values" in err
    code, err = run_failing(temb_cli, f"--model_dir={alpha}", "--timesteps=1",
                            "--inputs=resolution=1024,1024", out)
    assert code == 1 and "aspect_ratio: required by this pixart model" in err
    code, err = run_failing(temb_cli, f"--model_dir={sigma}", "--timesteps=1",
                            "--inputs=resolution=1024,1024", out)
    assert code == 1 and "resolution: pixart model does not take" in err
    # Qwen-Image-Layered's index: missing, given to a plain Qwen-Image, or
    # not a row of its two-row table.
    _, layered, _ = saved[("qwen-image-layered", "bf16")]
    code, err = run_failing(temb_cli, f"--model_dir={layered}",
                            "--timesteps=1", out)
    assert code == 1 and \
        "addition_t_cond: required by this qwen-image model" in err
    code, err = run_failing(temb_cli, f"--model_dir={qwen}", "--timesteps=1",
                            "--inputs=addition_t_cond=0", out)
    assert code == 1 and \
        "addition_t_cond: qwen-image model does not take" in err
    for bad in ("2", "0.5", "-1"):
        code, err = run_failing(temb_cli, f"--model_dir={layered}",
                                "--timesteps=1,2",
                                f"--inputs=addition_t_cond=0,{bad}", out)
        assert code == 1 and ("addition_t_cond[1] must be an integer in "
                              f"[0, 2), got {bad}") in err, err
    # Sana's weights under a config that claims Sana-Sprint's guidance
    # embedder are refused, naming the embedder's missing tensor; Sana-Sprint
    # without its guidance scale is refused naming the input.
    _, sana, _ = saved[("sana", "bf16")]
    sprint = tmp_path / "sprint"
    sprint.mkdir()
    for item in sana.iterdir():
        (sprint / item.name).write_bytes(item.read_bytes())
    config = json.loads((sprint / "config.json").read_text())
    config["guidance_embeds"] = True
    (sprint / "config.json").write_text(json.dumps(config))
    code, err = run_failing(temb_cli, f"--model_dir={sprint}",
                            "--timesteps=1", "--guidance=4.5", out)
    assert code == 1 and \
        "time_embed.timestep_embedder.linear_1.weight" in err, err
    _, sprint, _ = saved[("sana-sprint", "bf16")]
    code, err = run_failing(temb_cli, f"--model_dir={sprint}",
                            "--timesteps=1", out)
    assert code == 1 and "guidance: required by this sana model" in err, err
    # An image_condition_type HunyuanVideo does not have is refused, naming
    # the field and the supported values.
    _, hunyuan, _ = saved[("hunyuanvideo", "bf16")]
    i2v = tmp_path / "i2v"
    i2v.mkdir()
    for item in hunyuan.iterdir():
        (i2v / item.name).write_bytes(item.read_bytes())
    config = json.loads((i2v / "config.json").read_text())
    config["image_condition_type"] = "first_frame"
    (i2v / "config.json").write_text(json.dumps(config))
    code, err = run_failing(temb_cli, f"--model_dir={i2v}", "--timesteps=1",
                            "--guidance=6", out)
    assert code == 1 and "field image_condition_type" in err and \
        'supported: null, "latent_concat", "token_replace"' in err, err
    # The SDXL UNet: time ids missing, malformed, or of the wrong width.
    _, sdxl, _ = saved[("sdxl-unet", "bf16")]
    pooled_file = tmp_path / "pooled.npy"
    np.save(pooled_file, np.zeros(POOLED, dtype=np.float32))
    code, err = run_failing(temb_cli, f"--model_dir={sdxl}", "--timesteps=1",
                            f"--pooled={pooled_file}", out)
    assert code == 1 and "time_ids: required by this sdxl-unet model" in err
    code, err = run_failing(temb_cli, f"--model_dir={sdxl}", "--timesteps=1",
                            f"--pooled={pooled_file}", "--inputs=time_ids",
                            out)
    assert code == 1 and "--inputs: 'time_ids' is not name=values" in err
    code, err = run_failing(temb_cli, f"--model_dir={sdxl}", "--timesteps=1",
                            f"--pooled={pooled_file}",
                            f"--inputs=time_ids=@{narrow}", out)
    assert code == 1 and "time_ids: expected 6 or 6 values" in err
    # The device: a name it does not know; CUDA where no GPU runs.
    code, err = run_failing(temb_cli, f"--model_dir={qwen}", "--timesteps=1",
                            "--device=tpu", out)
    assert code == 2 and '--device must be cpu or cuda, got "tpu"' in err
    if DEVICE != "cuda":
        code, err = run_failing(temb_cli, f"--model_dir={qwen}",
                                "--timesteps=1", "--device=cuda", out)
        assert code == 1 and "--device=cuda: " in err
