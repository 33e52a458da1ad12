"""A diffusion transformer whose time conditioning is served by temb.

    import temb, temb.torch
    client = temb.Client("localhost:50051")
    offload = temb.torch.offload_conditioning(
        pipe.transformer, client=client, model="qwen-image",
        schedule=pipe.scheduler.timesteps)
    image = pipe(prompt).images[0]        # same latents, weights freed

Every timestep-dependent module of the transformer (the time, guidance and
pooled-text embedders, each block's modulation Linear, the output norm's
Linear; for SDXL's UNet its time and added embeddings and every resnet's
time_emb_proj) is replaced, and their parameters are released.  The replaced
embedder asks temb's conditioning model for the step's rows (at most one
call per forward; with a schedule, one call for all of its steps) and
returns the ``temb`` row with the whole answer attached to it; the SiLU
before each modulation Linear becomes a pass-through, so the Linear's
replacement receives that very tensor and reads its block's slice.

A family is a table (_FAMILIES): how its pipeline turns the scheduler's t
(and the guidance scale) into what the embedder receives, and which module
reads which output at which block position.  Besides those:

  * additive ``scale_shift_table``s (Wan, PixArt, LTX-Video) become
    parameter-free stand-ins whose sum with the model's addend is the
    served sum;
  * weighted modules on the time path that are not modulation Linears pass
    the served temb on (Wan's float32 time MLP, CogVideoX's time
    embedding) or add nothing to it, where the served temb already holds
    their part (CogVideoX 1.5's ofs embedding, the UNet's time_embedding);
  * the served model's inputs beyond t, guidance and the pooled row
    (SDXL's time ids, PixArt-alpha's resolution and aspect ratio,
    CogVideoX 1.5's ofs) are keyed and sent like pooled rows; where the
    embedder's own arguments lack one, a forward pre-hook records it where
    the model has it (a parameterless module before the embedder, or the
    transformer's forward);
  * each distinct row is asked for once, so Wan 2.2 TI2V's per-token
    timesteps cost two rows, not one per token.

This module is imported by temb.torch (it needs PyTorch).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import hashlib
import inspect
import math
import os
import pickle
import threading
from typing import (Any, Callable, Dict, List, Optional, Sequence, Tuple,
                    Union, cast)

import torch

__all__ = ["OffloadedConditioning", "conditioning_modules",
           "offload_conditioning"]

# torch.compile's marker for code it leaves to eager mode (PyTorch >= 2.1).
_not_compiled = getattr(getattr(torch, "compiler", None), "disable",
                        lambda function: function)

# The names the pooled text embedding goes by in the embedders' and the
# transformers' arguments (HiDream-I1's forward: pooled_embeds).
_POOLED_NAMES = ("pooled_projection", "pooled_projections", "pooled_embeds")

# The attribute of the embedder's output that carries the step's answer.
_ANSWER = "_temb_conditioning"

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16",
                torch.float16: "fp16", torch.float64: "fp64"}


# --- what the served model replaces -----------------------------------------
#
# The conditioning model describes, per output, the transformer module it
# stands for (ConditioningOutput.replaces, .replaced_kind, .blocks,
# .input_module) and the modules with weights its outputs fold in besides
# (ConditioningModel.folded_modules).  That description is read here into
# the rows below; nothing in this module names a family's modules.


@dataclasses.dataclass(frozen=True)
class _Slot:
    """A modulation Linear replaced by a lookup: `linear` reads output
    `output` at block position `index` (None: an [N, W] output), and its
    input module `silu` (the SiLU before it) becomes a pass-through.
    `silu` is None where the description names none (a UNet resnet's
    nonlinearity also acts on its hidden states): the lookup then reads
    the embedder's latest answer."""
    linear: str
    silu: Optional[str]
    output: str
    index: Optional[int]


@dataclasses.dataclass(frozen=True)
class _Table:
    """An additive table (a scale_shift_table parameter) replaced by a
    parameter-free stand-in: where the model adds the table to its
    modulation, the stand-in returns output `output` at block position
    `index`, which is that very sum."""
    table: str
    output: str
    index: Optional[int]


@dataclasses.dataclass(frozen=True)
class _StandIn:
    """A folded module: kind "passes_on" (its result is already the served
    value it is handed, so it returns its input) or "adds_nothing" (the
    model adds its result to a served value that already holds it, so it
    returns -0.0: x + -0.0 == x for every x, -0.0 included)."""
    path: str
    kind: str


@dataclasses.dataclass(frozen=True)
class _Replaced:
    """What a served conditioning model stands for in a transformer."""
    embedder: str      # the module that returns ...
    temb_output: str   # ... this output
    slots: Tuple[_Slot, ...]
    tables: Tuple[_Table, ...]
    stand_ins: Tuple[_StandIn, ...]

    def modules(self) -> List[str]:
        """Every replaced module's and table's name, the embedder first."""
        return ([self.embedder] + [slot.linear for slot in self.slots]
                + [s.path for s in self.stand_ins]
                + [table.table for table in self.tables])


def _replaced(served: Any) -> _Replaced:
    """The served model's description (a ConditioningModel of
    ``client.models()``) as rows.  A module that two outputs name (a second
    embedding read by the same Linears, HunyuanVideo-I2V's token_replace)
    is replaced once, for the first."""
    embedder: Optional[Tuple[str, str]] = None
    slots: List[_Slot] = []
    tables: List[_Table] = []
    taken = set()
    for output in served.outputs:
        kind = getattr(output, "replaced_kind", "")
        if kind == "embedder":
            embedder = (output.replaces, output.name)
            continue
        if kind not in ("linear", "table"):
            continue
        blocks = tuple(output.blocks)
        rows = (list(enumerate(blocks)) if blocks
                else [(None, None)])
        for index, block in rows:
            path = output.replaces.replace("{i}", str(block))
            if path in taken:
                continue
            taken.add(path)
            if kind == "table":
                tables.append(_Table(path, output.name, index))
            else:
                silu = output.input_module.replace("{i}", str(block))
                slots.append(_Slot(path, silu or None, output.name, index))
    if embedder is None:
        raise ValueError(
            f"offload_conditioning: temb model {served.name!r} names no "
            "embedder among its outputs' replaced modules (a server older "
            "than this client?)")
    stand_ins = tuple(_StandIn(f.module, f.kind)
                      for f in getattr(served, "folded_modules", ()))
    return _Replaced(embedder[0], embedder[1], tuple(slots), tuple(tables),
                     stand_ins)


# --- families ---------------------------------------------------------------
#
# What the description does not say yet: how each family's pipeline turns
# the scheduler's t into what the embedder receives, the embedder's
# arguments, and the taps that record inputs it lacks.

# What a family's helpers below are handed: a diffusers transformer (or
# SDXL's UNet) of that family.  They read its config by attribute, which
# torch.nn.Module types as `Tensor | Module`: typed as Any.
_Model = Any


def _chroma_width(model: _Model) -> int:
    # A D-wide modulation vector per index of the mod_proj buffer.
    return (model.time_text_embed.mod_proj.shape[0]
            * model.distilled_guidance_layer.out_proj.out_features)


def _pixart_inputs(model: _Model) -> Tuple[str, ...]:
    # PixArt-alpha's micro-conditions, passed to the embedder by name.
    return (("resolution", "aspect_ratio")
            if model.adaln_single.emb.use_additional_conditions else ())


def _qwen_layered_inputs(model: _Model) -> Tuple[str, ...]:
    # The forward's additional_t_cond, the embedder's third argument.
    return ("addition_t_cond",)


def _cogview4_inputs(model: _Model) -> Tuple[str, ...]:
    # CogView4's size conditions, the embedder's arguments by name.
    return ("original_size", "crop_coords", "target_size")


def _cogvideox_inputs(model: _Model) -> Tuple[str, ...]:
    # CogVideoX 1.5 I2V: the forward's `ofs` (its pipeline passes 2.0).
    return ("ofs",) if model.ofs_embedding is not None else ()


def _hunyuan_video15_inputs(model: _Model) -> Tuple[str, ...]:
    # The super-resolution (MeanFlow) model: the embedder's timestep_r, the
    # next step's timestep (0 at the last), in the latents' dtype.
    return ("timestep_r",) if model.config.get("use_meanflow") else ()


# --- FLUX.2, HunyuanVideo-1.5 and SDXL's UNet -------------------------------







def _t_hunyuan_video15(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # HunyuanVideo-1.5's pipeline: t.to(latents' dtype), at the 0..1000
    # scale, and the model embeds it as it comes.
    return t.to(dtype)


def _unet_inputs(model: _Model) -> Tuple[str, ...]:
    # The pipeline's add_time_ids (original size, crop, target size), six
    # per row, beside the pooled text embedding.
    return ("time_ids",)


def _unet_pooled_width(model: _Model) -> int:
    # add_embedding's input: the pooled text embedding, then one sinusoid
    # of addition_time_embed_dim per time id (6 for SDXL, as served).
    return (model.add_embedding.linear_1.in_features
            - 6 * model.config.addition_time_embed_dim)


def _t_over_1000(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Qwen-Image's pipeline: t.to(dtype) / 1000, passed as `timestep`; the
    # model's .to(hidden_states.dtype) is then a no-op.
    return t.to(dtype) / 1000


def _t_fraction_then_cast(t: torch.Tensor,
                          dtype: torch.dtype) -> torch.Tensor:
    # AuraFlow's pipeline: t / 1000 in float32, then .to(latents' dtype).
    return (t.to(torch.float32) / 1000).to(dtype)


def _t_in_model_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Bria's pipeline passes float32 t; the model casts it to its dtype.
    return t.to(torch.float32).to(dtype)


def _t_flux(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # FLUX.1's pipeline divides as Qwen-Image's; the model multiplies back
    # in its dtype before time_text_embed.
    return _t_over_1000(t, dtype).to(dtype) * 1000


def _t_as_is(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # SD3's pipeline passes the scheduler's float32 t, never cast.
    return t.to(torch.float32)


def _t_scaled(t: torch.Tensor, dtype: torch.dtype,
              scale: float) -> torch.Tensor:
    # Sana's pipeline: t.expand(B) * transformer.config.timestep_scale, a
    # float32 product.
    return t.to(torch.float32) * scale


def _t_z_image(t: torch.Tensor, dtype: torch.dtype,
               scale: float) -> torch.Tensor:
    # Z-Image's pipeline: (1000 - t) / 1000 in float32; the model embeds
    # that times config.t_scale.
    return (1000 - t.to(torch.float32)) / 1000 * scale


def _t_z_image_back(seen: torch.Tensor, scale: float) -> torch.Tensor:
    return 1000 - seen * (1000 / scale)


def _t_lumina2(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Lumina-Image-2.0's pipeline: 1 - t / 1000 in float32 (t = 0 is the
    # noise), embedded as it is.
    return 1 - t.to(torch.float32) / 1000


def _t_lumina2_back(seen: torch.Tensor) -> torch.Tensor:
    return (1 - seen) * 1000


def _guidance_flux(g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # The pipeline's float32 scale, .to(dtype) * 1000 in the model.
    return g.to(dtype) * 1000


def _t_sana_sprint(schedule: torch.Tensor) -> torch.Tensor:
    # SanaSprintPipeline's timestep from SCMScheduler's t, float32, as it
    # computes it at each step (the same bits for a whole schedule).
    return torch.sin(schedule) / (torch.cos(schedule) + torch.sin(schedule))


def _guidance_scaled(g: torch.Tensor, dtype: torch.dtype,
                     scale: float) -> torch.Tensor:
    # SanaSprintPipeline: the guidance scale .to(dtype) *
    # transformer.config.guidance_embeds_scale, a product in that dtype.
    return g.to(dtype) * scale


@dataclasses.dataclass(frozen=True)
class _Family:
    name: str
    # The replaced embedder's forward arguments, in diffusers' order
    # ("timestep", "guidance", "pooled", or "-" for one it ignores).
    arguments: Tuple[str, ...]
    # Scheduler t -> the timestep the embedder receives, and for going back
    # the factor between them (embedder value ~= t * factor), or a function
    # from the embedder's value (float64) to about t.
    timestep: Callable[[torch.Tensor, torch.dtype], torch.Tensor]
    timestep_factor: Any
    guidance: Optional[Callable[[torch.Tensor, torch.dtype],
                                torch.Tensor]] = None
    guidance_factor: float = 1.0
    # The module whose parameters' dtype is the model's compute dtype
    # (default: the embedder).
    dtype_module: Optional[str] = None
    # Outputs served in float32 whatever the model's dtype.
    float32_outputs: Tuple[str, ...] = ()
    # The model's other inputs of the conditioning (the served model's
    # inputs beside timesteps, guidance and pooled_projections), per row,
    # read from the embedder's arguments or from a tap.
    extra_inputs: Optional[Callable[[_Model], Tuple[str, ...]]] = None
    # Where the embedder's own arguments lack one of the inputs
    # ("timestep", "guidance" or an extra input), the module that receives
    # it first: (path, input).  A forward pre-hook there records it for the
    # embedder: a parameterless module's first argument (the UNet's
    # time_proj gets t, its add_time_proj the flattened time ids, both
    # before add_embedding runs; Sana-Sprint's time_proj and
    # guidance_condition_proj), or with path "" the transformer's forward
    # argument of that name (CogVideoX 1.5's ofs, embedded only after the
    # timestep).  A tap for an extra input the model lacks is not set.
    taps: Tuple[Tuple[str, str], ...] = ()
    # The embedder's "pooled" argument holds the pooled row in its first
    # pooled_width(model) columns (the UNet's add_embedding receives
    # [text_embeds, sinusoids of the time ids]); None: all of it.
    pooled_width: Optional[Callable[[_Model], int]] = None
    # The embedder returns (temb, second): HunyuanVideo's second result is
    # its token_replace embedding, None unless image_condition_type is
    # "token_replace".
    returns_pair: bool = False
    # Where there is a second embedding (token_replace), read by the same
    # modulation Linears as temb: (the output a module reads, the served
    # output holding its rows for the second embedding) pairs, the first
    # for the embedding itself.  The second result carries an answer of
    # those rows, so that each Linear's stand-in answers for what it is
    # given.
    second: Tuple[Tuple[str, str], ...] = ()
    # The pipeline's map from its scheduler's timesteps to the t the served
    # model takes, where that is not the scheduler's t: set_schedule()
    # applies it (SanaSprintPipeline's sin / (cos + sin)).
    schedule: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
    # The model stacks the rows of t and of t * 0 (Qwen-Image-Edit-2511's
    # zero_cond_t: its reference image's tokens read the second half of
    # img_mod) and gives the other modules the first half alone.  The
    # second half is the served row of timestep 0, fetched with the
    # schedule.
    zero_rows: bool = False
    # The served temb's row width where no modulation Linear reads it
    # (Chroma's: a D-wide vector per modulation index).
    temb_width: Optional[Callable[[_Model], int]] = None
    # The model may also embed the scheduler's t = 0 for some tokens:
    # Z-Image's omni mode embeds t = 1 (its pipeline's (1000 - t) / 1000 of
    # t = 0) for the clean condition images' tokens beside the noisy
    # target's t.  That row is fetched with the schedule.
    clean_row: bool = False


_QWEN = _Family("qwen-image", ("timestep", "-", "-"), _t_over_1000, 1e-3)
_QWEN_EDIT = dataclasses.replace(_QWEN, name="qwen-image-edit",
                                 zero_rows=True)
# Qwen-Image-Layered: the embedder's third argument picks a row of its
# addition_t_embedding (the pipeline's is_rgb, 0), served by index.
_QWEN_LAYERED = dataclasses.replace(
    _QWEN, name="qwen-image-layered",
    arguments=("timestep", "-", "addition_t_cond"),
    extra_inputs=_qwen_layered_inputs)
_FLUX_DEV = _Family("flux.1-dev", ("timestep", "guidance", "pooled"),
                    _t_flux, 1.0, _guidance_flux, 1000.0)
_FLUX_SCHNELL = _Family("flux.1-schnell", ("timestep", "pooled"), _t_flux,
                        1.0)
_SD3 = _Family("sd3", ("timestep", "pooled"), _t_as_is, 1.0)

# Wan, PixArt and CogVideoX pipelines pass the scheduler's t as it is (Wan
# 2.2 TI2V: per token, [B, seq], flattened by the model before the
# embedder); PixArt and CogVideoX batch their CFG rows.
_WAN = _Family("wan", ("timestep",), _t_as_is, 1.0,
               dtype_module="condition_embedder.time_proj",
               float32_outputs=("block_mod", "norm_out"))
_PIXART = _Family("pixart", ("timestep", "resolution", "aspect_ratio"),
                  _t_as_is, 1.0,
                  extra_inputs=_pixart_inputs)
# Sana's pipeline scales the scheduler's t by the config's timestep_scale
# (_family_of sets it per model).
_SANA = _Family("sana", ("timestep", "resolution", "aspect_ratio"),
                _t_as_is, 1.0)
# Sana-Sprint: SanaSprintPipeline computes the transformer's timestep
# itself (sin / (cos + sin) of SCMScheduler's t, float32), which the
# conditioning model takes as it is, and a schedule is mapped so; taps on
# the two parameterless projections give the embedder t and the guidance
# (_family_of sets the guidance's scale per model).
_SANA_SPRINT = _Family("sana-sprint", ("-",), _t_as_is, 1.0,
                       taps=(("time_embed.time_proj", "timestep"),
                             ("time_embed.guidance_condition_proj",
                              "guidance")),
                       schedule=_t_sana_sprint)
# HunyuanVideo (1.0): FLUX.1-dev's modules; its pipeline passes float32 t
# as it is and the guidance tensor in the model's dtype times 1000.
_HUNYUAN_VIDEO = _Family("hunyuanvideo", ("timestep", "pooled", "guidance"),
                         _t_as_is, 1.0, _guidance_flux, 1000.0,
                         returns_pair=True)
# HunyuanVideo-I2V's token_replace: the first frame's tokens read the
# image and single-stream modulations of token_replace_emb (t = 0 and the
# pooled row, no guidance), served beside temb's.
_TOKEN_REPLACE = (("temb", "tr_temb"), ("img_mod", "tr_img_mod"),
                  ("single_mod", "tr_single_mod"))
# Lumina-Image-2.0: its Timesteps module is the embedder, as Wan's.
_LUMINA2 = _Family("lumina2", ("timestep",), _t_lumina2, _t_lumina2_back,
                   dtype_module="time_caption_embed.timestep_embedder")
# Z-Image: the final layer of the released patch sizes, the only one the
# conditioning model serves; the time and scale set per model by
# _family_of.  In omni mode the embedder runs twice a forward, for t and
# for the clean images' t = 1, and each modulation is handed the answer of
# the embedding it reads.
_Z_IMAGE = _Family("z-image", ("timestep",), _t_as_is, 1.0, clean_row=True)
# Chroma: its distilled guidance layer (the embedder) maps the
# time_text_embed rows to every modulation vector, [N, indices, D], which
# the blocks slice; no block has a modulation Linear.  A tap on the
# parameterless time_proj gives it t, after FLUX.1's arithmetic.
_CHROMA = _Family("chroma", ("-",), _t_flux, 1.0,
                  taps=(("time_text_embed.time_proj", "timestep"),),
                  temb_width=_chroma_width)
# The approximator Chroma's conditioning models compute.
_CHROMA_REQUIRED = {"approximator_num_channels": 64, "approximator_layers": 5}
# HiDream-I1's pipeline passes the scheduler's float32 t; the pooled
# embedding reaches p_embedder after t_embedder, so a tap on the forward
# gives it to the embedder.
_HIDREAM = _Family("hidream-i1", ("timestep", "-"), _t_as_is, 1.0,
                   taps=(("", "pooled_embeds"),))
# LTX-Video's pipelines pass the scheduler's float32 t (image-to-video: per
# token, t * (1 - mask)); the model flattens it before the embedder.
_LTX = _Family("ltx-video", ("timestep", "resolution", "aspect_ratio"),
               _t_as_is, 1.0)
_COGVIDEOX = _Family("cogvideox", ("timestep",), _t_as_is, 1.0,
                     dtype_module="time_embedding",
                     extra_inputs=_cogvideox_inputs, taps=(("", "ofs"),))

# CogView4: its pipeline passes the scheduler's float32 t and the size
# conditions in the prompt embedding's dtype, the embedder's arguments.
_COGVIEW4 = _Family("cogview4", ("timestep", "original_size", "target_size",
                                 "crop_coords", "-"), _t_as_is, 1.0,
                    extra_inputs=_cogview4_inputs)
# LongCat-Image and Ovis-Image: FLUX.1's t arithmetic, no pooled text;
# LongCat-Image's time_embed is one module, Ovis-Image's embedder its
# parameterless time_proj.
_LONGCAT_IMAGE = _Family("longcat-image", ("timestep", "-"), _t_flux, 1.0)
_OVIS_IMAGE = _Family("ovis-image", ("timestep",), _t_flux, 1.0,
                      dtype_module="timestep_embedder")
# HunyuanImage-2.1: t and the MeanFlow model's timestep_r in the model's
# dtype, the distilled model's guidance scale * 1000 in it
# (_family_of drops the guidance for a model without its embedder).
_HUNYUAN_IMAGE = _Family("hunyuanimage-2.1",
                         ("timestep", "timestep_r", "guidance"),
                         _t_hunyuan_video15, 1.0, _guidance_flux, 1000.0,
                         extra_inputs=_hunyuan_video15_inputs)
# Bria 3.2: its pipeline passes the scheduler's float32 t, which the model
# casts to its dtype before the embedder.
_BRIA = _Family("bria", ("timestep", "-"), _t_in_model_dtype, 1.0)
# AuraFlow: its Timesteps module is the embedder, handed t / 1000 as the
# pipeline rounds it.
_AURAFLOW = _Family("auraflow", ("timestep",), _t_fraction_then_cast, 1e-3,
                    dtype_module="norm_out.linear")
# MiniMax-H3 has no pipeline in diffusers 0.42.1: its forward's timestep,
# the distinct noise levels in [0, 1], reaches the embedder (the
# parameterless time_proj) as it is, and is what the conditioning model
# takes; a schedule is those levels.  The time MLP and temb are float32.
_MINIMAX_H3 = _Family("minimax-h3", ("timestep",), _t_as_is, 1.0,
                      dtype_module="norm_out.linear",
                      float32_outputs=("temb",))

# FLUX.2's pipelines pass t and the guidance as FLUX.1's do; klein passes
# guidance=None.
_FLUX2_DEV = _Family("flux.2-dev", ("timestep", "guidance"), _t_flux, 1.0,
                     _guidance_flux, 1000.0)
_FLUX2_KLEIN = _Family("flux.2-klein", ("timestep", "-"), _t_flux, 1.0)
# time_embed(timestep, timestep_r): timestep_r only with use_meanflow,
# which is refused.
_HUNYUAN_VIDEO15 = _Family("hunyuanvideo-1.5", ("timestep", "timestep_r"),
                           _t_hunyuan_video15, 1.0,
                           extra_inputs=_hunyuan_video15_inputs)
# The UNet's embedder, add_embedding, receives the pooled row (and the
# time ids' sinusoids); taps on the two parameterless projections give it t
# and the time ids.  The pipeline passes the scheduler's t as it is
# (float32 in the sinusoid).
_SDXL_UNET = _Family("sdxl-unet", ("pooled",), _t_as_is, 1.0,
                     extra_inputs=_unet_inputs,
                     taps=(("time_proj", "timestep"),
                           ("add_time_proj", "time_ids")),
                     pooled_width=_unet_pooled_width)

# The UNet config values whose other settings change emb and that the
# conditioning model refuses (server/models/families/sdxl_unet.cc).
_UNET_REQUIRED = {"addition_embed_type": "text_time",
                  "time_embedding_type": "positional",
                  "time_cond_proj_dim": None, "class_embed_type": None,
                  "num_class_embeds": None, "time_embedding_act_fn": None,
                  "timestep_post_act": None, "resnet_skip_time_act": False}


def _require(name: str, config: Dict[str, Any], required: Dict[str, Any],
             what: str) -> None:
    """Refuses a config whose field differs from the value the served
    family is computed for (an absent field counts as that value)."""
    for key, value in required.items():
        if config.get(key, value) != value:
            raise ValueError(
                f"offload_conditioning: {name} with {key}="
                f"{config.get(key)!r} is not served by temb's conditioning "
                f"models ({what} {value!r})")


def _family_of(model: torch.nn.Module) -> _Family:
    name = type(model).__name__
    config = getattr(model, "config", {})
    if name == "QwenImageTransformer2DModel":
        if config.get("guidance_embeds"):
            raise ValueError(
                "offload_conditioning: QwenImageTransformer2DModel with "
                "guidance_embeds=True is not served by temb's conditioning "
                "models")
        if config.get("use_additional_t_cond"):
            if config.get("zero_cond_t"):
                raise ValueError(
                    "offload_conditioning: QwenImageTransformer2DModel with "
                    "both use_additional_t_cond and zero_cond_t is not "
                    "served by temb's conditioning models")
            return _QWEN_LAYERED
        return _QWEN_EDIT if config.get("zero_cond_t") else _QWEN
    if name == "FluxTransformer2DModel":
        return _FLUX_DEV if config.get("guidance_embeds") else _FLUX_SCHNELL
    if name == "SD3Transformer2DModel":
        return _SD3
    # Wan 2.1/2.2, PixArt-Sigma/alpha, CogVideoX (1.5).
    if name == "WanTransformer3DModel":
        return _WAN
    if name == "PixArtTransformer2DModel":
        return _PIXART
    if name == "LTXVideoTransformer3DModel":
        return _LTX
    if name == "HiDreamImageTransformer2DModel":
        return _HIDREAM
    if name == "Lumina2Transformer2DModel":
        return _LUMINA2
    if name == "ChromaTransformer2DModel":
        _require(name, config, _CHROMA_REQUIRED, "the released model's is")
        return _CHROMA
    if name == "HunyuanVideoTransformer3DModel":
        # HunyuanVideo-I2V's latent_concat changes the latents only;
        # token_replace embeds a second row for the first frame's tokens.
        condition = config.get("image_condition_type")
        if condition not in (None, "latent_concat", "token_replace"):
            raise ValueError(
                "offload_conditioning: HunyuanVideoTransformer3DModel with "
                f"image_condition_type={condition!r} is not served by temb's "
                "conditioning models")
        family = _HUNYUAN_VIDEO
        if condition == "token_replace":
            family = dataclasses.replace(family, second=_TOKEN_REPLACE)
        if not config.get("guidance_embeds", True):
            family = dataclasses.replace(
                family, arguments=("timestep", "pooled", "-"), guidance=None)
        return family
    if name == "ZImageTransformer2DModel":
        sizes = (list(config.get("all_patch_size", ())),
                 list(config.get("all_f_patch_size", ())))
        if sizes != ([2], [1]):
            raise ValueError(
                "offload_conditioning: ZImageTransformer2DModel with "
                f"all_patch_size={sizes[0]}, all_f_patch_size={sizes[1]} is "
                "not served by temb's conditioning models ([2] and [1])")
        scale = float(config.get("t_scale", 1000.0))
        return dataclasses.replace(
            _Z_IMAGE, timestep=functools.partial(_t_z_image, scale=scale),
            timestep_factor=functools.partial(_t_z_image_back, scale=scale))
    if name == "SanaTransformer2DModel":
        if config.get("guidance_embeds"):
            scale = float(config.get("guidance_embeds_scale", 0.1))
            return dataclasses.replace(
                _SANA_SPRINT,
                guidance=functools.partial(_guidance_scaled, scale=scale),
                guidance_factor=scale)
        scale = float(config.get("timestep_scale", 1.0))
        return dataclasses.replace(
            _SANA, timestep=functools.partial(_t_scaled, scale=scale),
            timestep_factor=scale)
    if name == "CogVideoXTransformer3DModel":
        activation = config.get("timestep_activation_fn", "silu")
        if activation != "silu":
            raise ValueError(
                "offload_conditioning: CogVideoXTransformer3DModel with "
                f"timestep_activation_fn={activation!r} is not served by "
                "temb's conditioning models (SiLU only)")
        return _COGVIDEOX
    # FLUX.2 dev/klein, HunyuanVideo-1.5, SDXL's UNet.
    if name == "Flux2Transformer2DModel":
        return _FLUX2_DEV if config.get("guidance_embeds") else _FLUX2_KLEIN
    if name == "HunyuanVideo15Transformer3DModel":
        return _HUNYUAN_VIDEO15
    if name == "UNet2DConditionModel":
        _require(name, config, _UNET_REQUIRED, "SDXL's UNet has")
        return _SDXL_UNET
    if name == "MiniMaxH3Transformer3DModel":
        return _MINIMAX_H3
    if name == "AuraFlowTransformer2DModel":
        return _AURAFLOW
    if name == "CogView4Transformer2DModel":
        return _COGVIEW4
    if name == "LongCatImageTransformer2DModel":
        return _LONGCAT_IMAGE
    if name == "OvisImageTransformer2DModel":
        return _OVIS_IMAGE
    if name == "BriaTransformer2DModel":
        return _BRIA
    if name == "HunyuanImageTransformer2DModel":
        if not config.get("guidance_embeds"):
            return dataclasses.replace(
                _HUNYUAN_IMAGE, arguments=("timestep", "timestep_r", "-"),
                guidance=None)
        return _HUNYUAN_IMAGE
    raise ValueError(
        f"offload_conditioning: {type(model).__module__}.{name} is not a "
        "family temb serves (QwenImageTransformer2DModel, "
        "FluxTransformer2DModel, SD3Transformer2DModel, "
        "WanTransformer3DModel, PixArtTransformer2DModel, "
        "LTXVideoTransformer3DModel, HiDreamImageTransformer2DModel, "
        "SanaTransformer2DModel, ZImageTransformer2DModel, "
        "Lumina2Transformer2DModel, HunyuanVideoTransformer3DModel, "
        "ChromaTransformer2DModel, "
        "CogVideoXTransformer3DModel, "
        "Flux2Transformer2DModel, "
        "HunyuanVideo15Transformer3DModel, UNet2DConditionModel, "
        "MiniMaxH3Transformer3DModel, AuraFlowTransformer2DModel, "
        "CogView4Transformer2DModel, LongCatImageTransformer2DModel, "
        "OvisImageTransformer2DModel, BriaTransformer2DModel, "
        "HunyuanImageTransformer2DModel)")


# --- going back from what the embedder receives to the scheduler's t ---------

_NEIGHBOURS = (0, -1, 1, -2, 2, -3, 3, -4, 4)


def _scheduler_values(seen: torch.Tensor, forward: Callable, factor: Any,
                      dtype: torch.dtype, what: str) -> torch.Tensor:
    """float32 values v with forward(v, dtype) == seen, bit for bit.

    The embedder receives the pipeline's t after its roundings (t.to(bf16)
    / 1000 ...), and temb takes the scheduler's t and applies the same
    roundings itself.  Any v that the pipeline's arithmetic maps onto
    `seen` gives the same rows, so v is searched among the float32 and
    bfloat16 neighbours of seen / factor (or of factor(seen), a function
    back), and each is checked with the pipeline's own operations."""
    seen32 = seen.detach().to("cpu", torch.float32).reshape(-1)
    start = (factor(seen32.double()) if callable(factor)
             else seen32.double() / factor).float()
    bits = start.view(torch.int32)
    neighbours = [(bits + k).view(torch.float32) for k in _NEIGHBOURS]
    neighbours += [(((bits >> 16) + k) << 16).view(torch.float32)
                   for k in _NEIGHBOURS]
    candidates = torch.stack(neighbours)  # [K, N]
    mapped = forward(candidates, dtype).to(torch.float32)
    match = mapped.view(torch.int32) == seen32.view(torch.int32)
    if not bool(match.any(0).all()):
        bad = seen32[~match.any(0)][0].item()
        raise ValueError(
            f"offload_conditioning: the transformer received {what} {bad!r} "
            f"({dtype}), which its pipeline's arithmetic does not produce "
            "from any scheduler value; is the transformer called the way "
            "its pipeline calls it?")
    first = match.to(torch.int8).argmax(0)
    return candidates.gather(0, first[None])[0]


# --- the weights' identity --------------------------------------------------

_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16",
                       torch.float16: "F16"}


def _fingerprint(tensor: torch.Tensor) -> Optional[str]:
    """The server's fingerprint of a weight tensor's bytes (defined in
    server/models/include/temb/models/weight_fingerprint.h): SHA-256 over
    the dtype, the byte count and the bytes, or 16 windows of 4 KiB of
    them, the first 16 hex digits.  None on the meta device."""
    if tensor.is_meta or tensor.dtype not in _SAFETENSORS_DTYPES:
        return None
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    size = data.numel()
    digest = hashlib.sha256(
        f"{_SAFETENSORS_DTYPES[tensor.dtype]}\n{size}\n".encode())
    if size <= 65536:
        digest.update(data.cpu().numpy().tobytes())
    else:
        for i in range(16):
            offset = i * (size - 4096) // 15
            digest.update(data[offset:offset + 4096].cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _weight_fingerprints(transformer: torch.nn.Module, served: Any
                         ) -> Dict[str, str]:
    """{checkpoint name: fingerprint} of the tensors the patch replaces:
    the names are the transformer's parameter names, which are its
    checkpoint's."""
    found = {}
    for path, value in conditioning_modules(transformer, served).items():
        named = ([(path, value)] if isinstance(value, torch.Tensor) else
                 [(f"{path}.{name}", tensor)
                  for name, tensor in value.named_parameters()])
        for name, tensor in named:
            fingerprint = _fingerprint(tensor)
            if fingerprint is not None:
                found[name] = fingerprint
    return found


# --- the client, its reconnection after pickle and fork ---------------------

def _recipe_of(client: Any) -> Tuple[str, Any]:
    """What reopens an equal client elsewhere (after pickle, in a forked
    child): a temb.Client's settings, a temb.local engine's, or the object
    itself for any other client, which must then pickle without its
    connection."""
    try:
        from temb import local
        from temb.client import Client
    except ImportError:  # pragma: no cover - stubs missing
        Client = local = None  # type: ignore
    if Client is not None and isinstance(client, Client):
        return ("client", dict(client.settings))
    if local is not None and isinstance(client, local.Engine):
        return ("engine", dict(client.settings))
    return ("object", client)


def _reopen(recipe: Tuple[str, Any]) -> Any:
    kind, value = recipe
    if kind == "client":
        from temb.client import Client
        return Client(**value)
    if kind == "engine":
        from temb import local
        return local.engine(**value)
    return pickle.loads(pickle.dumps(value))


def _missing_modules(transformer: torch.nn.Module,
                     described: _Replaced) -> List[str]:
    """What the described modules and tables the transformer lacks say:
    per stacked output, how many of its served blocks the transformer has;
    else the first module it has not."""
    have = ({name for name, _ in transformer.named_modules()}
            | {name for name, _ in transformer.named_parameters()})
    problems = [f"{path}: not in the transformer"
                for path in [described.embedder]
                + [s.path for s in described.stand_ins] if path not in have]
    by_output: Dict[str, List[str]] = collections.defaultdict(list)
    for path, output in ([(s.linear, s.output) for s in described.slots]
                         + [(t.table, t.output) for t in described.tables]):
        by_output[output].append(path)
    for output, paths in by_output.items():
        present = [path in have for path in paths]
        if all(present):
            continue
        if len(paths) > 1 and any(present):
            problems.append(f"{output}: {len(paths)} blocks served, "
                            f"{sum(present)} in the transformer")
        else:
            lacking = paths[present.index(False)]
            problems.append(f"{output}: the transformer has no {lacking}")
    return problems


def _served_model(client: Any, model: str) -> Any:
    """The ready conditioning model `model` of ``client.models()``."""
    found = [m for m in client.models() if getattr(m, "name", None) == model]
    if not found:
        raise ValueError(f"offload_conditioning: the server has no "
                         f"conditioning model {model!r}")
    served = found[0]
    state = getattr(served, "state", "ready")
    if state != "ready":
        raise ValueError(
            f"offload_conditioning: temb model {model!r} is {state}"
            + (f": {served.message}" if getattr(served, "message", "")
               else ""))
    return served


# --- the shared state -------------------------------------------------------

class OffloadedConditioning:
    """What offload_conditioning returns, shared by the modules it put in
    the transformer: the client, the served model's name, the schedule and
    the row cache.

    Attributes:
      calls: how many times the client was asked (the cache's misses).
      freed_bytes: the parameter and buffer bytes the patch released.
      replaced: the qualified names of the modules replaced.
    """

    def __init__(self, family: _Family, described: _Replaced, client: Any,
                 model: str, expected: Dict[str, Tuple[int, ...]],
                 dtype: torch.dtype, cache_bytes: int,
                 timeout: Optional[float],
                 extra_inputs: Tuple[str, ...] = ()) -> None:
        self.family = family
        self.described = described
        # The served model's inputs besides timesteps, guidance and pooled
        # projections (SDXL's time_ids, PixArt-alpha's resolution,
        # CogVideoX 1.5's ofs); the family's taps set on this model, and
        # what they recorded for the coming embedder call; how many leading
        # columns of the embedder's "pooled" argument are the pooled row
        # (_Family.taps, _Family.pooled_width).
        self.extra_inputs = tuple(extra_inputs)
        self.taps: Tuple[Tuple[str, str], ...] = ()
        # What one forward leaves for its own modules (the taps' values,
        # the step's answer) is kept per thread: threads may share one
        # patched model as they may share an unpatched one.
        self._per_thread = threading.local()
        self.pooled_columns: Optional[int] = None
        self.model = model
        self.expected = expected
        self.dtype = dtype
        self.cache_bytes = int(cache_bytes)
        self.timeout = timeout
        self.calls = 0
        self.freed_bytes = 0
        self.replaced: List[str] = []
        self._schedule: Optional[torch.Tensor] = None
        self._scheduled: set = set()
        self._cache: collections.OrderedDict[Tuple, Dict[str, torch.Tensor]] \
            = collections.OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self._checked = False
        # The transformer's weight fingerprints by checkpoint name, compared
        # with the served model's by check_served_model().
        self.fingerprints: Dict[str, str] = {}
        self._prefetch: Optional[threading.Thread] = None
        self._prefetch_error: Optional[BaseException] = None
        self._recipe = _recipe_of(client)
        self._client = client
        self._pid = os.getpid()  # the process the client was opened in
        self._owner_pid = os.getpid()  # ... and the lock and thread made in

    # This thread's forward: what the taps recorded for its coming embedder
    # call, and the embedder's latest answer, which modules read where the
    # tensor they are given no longer carries it.  Eager under
    # torch.compile: per-thread storage is no graph's input.
    @_not_compiled
    def record_tap(self, name: str, value: Any) -> None:
        if not hasattr(self._per_thread, "tapped"):
            self._per_thread.tapped = {}
        self._per_thread.tapped[name] = value

    @_not_compiled
    def take_tapped(self) -> Dict[str, Any]:
        """What this thread's taps recorded since its last answer."""
        tapped = getattr(self._per_thread, "tapped", {})
        self._per_thread.tapped = {}
        return tapped

    @_not_compiled
    def set_current(self, answer: Optional[_Answer]) -> None:
        self._per_thread.current = answer

    @_not_compiled
    def current(self) -> Optional[_Answer]:
        """This thread's latest answer of the embedder, if any."""
        return getattr(self._per_thread, "current", None)

    def _own(self) -> None:
        """In a new process (forked, or unpickled), a lock and prefetch
        thread of its own: the parent's threads did not come along, and one
        may have held the lock at the fork."""
        if self._owner_pid != os.getpid():
            self._lock = threading.Lock()
            self._prefetch = None
            self._prefetch_error = None
            self._owner_pid = os.getpid()

    # The client: the caller's, or one reopened from the recipe in a new
    # process (unpickled, or a forked DataLoader worker).
    @property
    def client(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            self._client = _reopen(self._recipe)
            self._pid = os.getpid()
        return self._client

    def set_schedule(self, schedule: Any) -> None:
        """The scheduler timesteps of the coming denoising loop (e.g.
        ``pipe.scheduler.timesteps`` after ``set_timesteps``); None turns
        prefetching off.  A family whose rows depend on t alone
        (Qwen-Image) fetches them now, in the background, while the
        pipeline encodes its prompt; for the others the first step that
        misses the cache fetches every step's rows in the same call."""
        self._own()
        self.wait()
        if schedule is None:
            self._schedule = None
        else:
            self._schedule = torch.as_tensor(schedule).detach().to(
                "cpu", torch.float32).reshape(-1)
            if self.family.schedule is not None:
                self._schedule = self.family.schedule(self._schedule)
            if self.family.zero_rows or self.family.clean_row:
                self._schedule = torch.cat([self._schedule,
                                            self._schedule.new_zeros(1)])
        self._scheduled = set()
        # Rows of t alone: none of guidance, pooled (an argument of the
        # embedder's or tapped) or extra inputs.
        others = set(self.family.arguments) | {
            "pooled" if name in _POOLED_NAMES else name
            for _, name in self.family.taps}
        if (self._schedule is not None and not self.extra_inputs
                and not {"guidance", "pooled"} & others):
            self._scheduled.add(self._t_alone(self.dtype))
            self._prefetch = threading.Thread(
                target=self._prefetch_schedule,
                args=(self._schedule, self.dtype), daemon=True,
                name="temb-conditioning-prefetch")
            self._prefetch.start()

    def wait(self) -> None:
        """Waits for a schedule being fetched in the background.  If that
        failed, the steps fetch their own rows (and raise what the server
        says)."""
        self._own()
        thread = self._prefetch
        if thread is None:
            return
        thread.join()
        self._prefetch = None
        if self._prefetch_error is not None:
            self._prefetch_error = None
            self._scheduled.discard(self._t_alone(self.dtype))

    @staticmethod
    def _t_alone(dtype: torch.dtype) -> Tuple:
        # _scheduled's entry for the rows of t alone, fetched for the
        # transformer's dtype then: after .to(dtype) the embedder receives
        # other bits, and the schedule is fetched again for those.
        return (dtype, None, None, None)

    def _prefetch_schedule(self, schedule: torch.Tensor,
                           dtype: torch.dtype) -> None:
        try:
            with self._lock:
                seen = self.family.timestep(schedule, dtype).to(torch.float32)
                wanted: Dict[Tuple, int] = {}
                for s, bits in enumerate(seen.view(torch.int32).tolist()):
                    key = (bits, None, None, None)
                    if key not in self._cache:
                        wanted.setdefault(key, s)
                if not wanted:
                    return
                result = self._request(schedule[list(wanted.values())],
                                       None, None)
                for j, key in enumerate(wanted):
                    self._store(key, {name: result[name][j].to(
                        self.row_dtype(name)).clone()
                        for name in self.expected})
        except Exception as e:  # the steps will ask again
            self._prefetch_error = e

    def cache_info(self) -> Dict[str, int]:
        return {"calls": self.calls, "entries": len(self._cache),
                "bytes": self._cached_bytes}

    def clear_cache(self) -> None:
        self._own()
        self.wait()
        with self._lock:
            self._cache.clear()
            self._cached_bytes = 0
            self._scheduled = set()

    # --- checking the served model against the transformer ---------------

    def _mismatch(self, served: Dict[str, Tuple[int, ...]],
                  served_dtype: Optional[str], family: str = "") -> List[str]:
        problems = []
        want = _DTYPE_NAMES.get(self.dtype, str(self.dtype))
        if served_dtype is not None and served_dtype != want:
            problems.append(
                f"dtype: served {served_dtype}, transformer {want}")
        missing = sorted(set(self.expected) - set(served))
        extra = sorted(set(served) - set(self.expected) - {"index"})
        if missing or extra:
            problems.append(
                f"family{f' (served {family})' if family else ''}: outputs "
                f"{missing} missing, {extra} not in a "
                f"{self.family.name} transformer")
        for name in sorted(set(self.expected) & set(served)):
            here, there = tuple(self.expected[name]), tuple(served[name])
            # Rows as [blocks, width] or [width]: a table family's answer
            # keeps the chunks the model splits ([L, 6, D]), its metadata
            # writes them flat ([L, 6D]).
            if len(here) == 2 and len(there) > 2:
                there = (there[0], _product(there[1:]))
            elif len(here) == 1 and len(there) > 1:
                there = (_product(there),)
            if here == there:
                continue
            if len(here) == 2 and len(there) == 2 and here[0] != there[0]:
                problems.append(f"{name}: {there[0]} blocks served, "
                                f"{here[0]} in the transformer")
            if here[-1] != there[-1]:
                problems.append(f"{name}: width {there[-1]} served, "
                                f"{here[-1]} in the transformer")
            if len(here) != len(there):
                problems.append(f"{name}: shape {list(there)} served, "
                                f"{list(here)} in the transformer")
        return problems

    def _raise_if_mismatched(self, problems: List[str]) -> None:
        if problems:
            raise ValueError(
                f"offload_conditioning: temb model {self.model!r} does not "
                f"match the {self.family.name} transformer: "
                + "; ".join(problems))

    def check_served_model(self, served: Any = None) -> bool:
        """Compares the served model's outputs (names, row shapes, dtype),
        inputs and weights with the transformer's; `served`: its
        ConditioningModel, else asked of ``client.models()``."""
        if served is None:
            served = _served_model(self.client, self.model)
        outputs = {o.name: tuple(o.row_shape) for o in served.outputs}
        dtypes = {o.dtype for o in served.outputs if o.name in self.expected
                  and o.name not in self.family.float32_outputs}
        problems = self._mismatch(outputs, served.dtype if getattr(
            served, "dtype", None) else (dtypes.pop() if len(dtypes) == 1
                                         else None),
            getattr(served, "family", ""))
        # An input standing for a value (the forward's own timestep) is an
        # alternative to the timesteps, not one more input.
        inputs = {i.name for i in getattr(served, "inputs", ())
                  if not getattr(i, "stands_for", "")}
        wants_guidance = "guidance" in self.family.arguments or any(
            name == "guidance" for _, name in self.family.taps)
        if inputs and ("guidance" in inputs) != wants_guidance:
            problems.append(
                "guidance: the served model "
                + ("takes" if "guidance" in inputs else "does not take")
                + " a guidance input, the transformer "
                + ("has" if wants_guidance else "has no")
                + " guidance embedder")
        served_extras = inputs - {"timesteps", "guidance",
                                  "pooled_projections"}
        if inputs and served_extras != set(self.extra_inputs):
            problems.append(
                f"inputs: the served model takes {sorted(served_extras)} "
                f"besides the timesteps, the transformer "
                f"{sorted(self.extra_inputs)}")
        served_weights = getattr(served, "weight_fingerprints", None) or {}
        if not problems and served_weights and self.fingerprints:
            # Same shapes, other weights: another checkpoint, or another
            # fine-tune of the same model.
            common = sorted(set(served_weights) & set(self.fingerprints))
            differ = [name for name in common
                      if served_weights[name] != self.fingerprints[name]]
            if not common:
                problems.append("weights: no tensor of the transformer's "
                                "is among the served model's")
            elif differ:
                problems.append(
                    f"weights: {len(differ)} of {len(common)} tensors "
                    f"differ from the served model's ({', '.join(differ[:3])}"
                    f"{', ...' if len(differ) > 3 else ''})")
        self._raise_if_mismatched(problems)
        self._checked = True
        return True

    # --- rows ----------------------------------------------------------------

    def _request(self, timesteps: torch.Tensor,
                 guidance: Optional[torch.Tensor],
                 pooled: Optional[torch.Tensor],
                 extras: Optional[Dict[str, torch.Tensor]] = None
                 ) -> Dict[str, torch.Tensor]:
        self.calls += 1
        kwargs: Dict[str, Any] = dict(extras or {})
        if guidance is not None:
            kwargs["guidance"] = guidance
        if pooled is not None:
            kwargs["pooled_projections"] = pooled
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        answer = self.client.condition(
            self.model, timesteps, outputs=sorted(self.expected),
            return_tensors="pt", **kwargs)
        result = {}
        for name in self.expected:
            if name not in answer:
                self._raise_if_mismatched(self._mismatch(
                    {k: tuple(torch.as_tensor(v).shape[1:])
                     for k, v in answer.items()}, None))
            result[name] = torch.as_tensor(answer[name])
        if not self._checked:
            served_dtypes = {_DTYPE_NAMES.get(v.dtype, str(v.dtype))
                             for k, v in result.items()
                             if k not in self.family.float32_outputs}
            # A client may widen bf16 to float32 holding the same value;
            # only a served dtype that is not float32 is known for sure.
            served_dtype = (served_dtypes.pop() if len(served_dtypes) == 1
                            and served_dtypes != {"fp32"} else None)
            self._raise_if_mismatched(self._mismatch(
                {k: tuple(v.shape[1:]) for k, v in result.items()},
                served_dtype))
            self._checked = True
        return result

    def _store(self, key: Tuple, row: Dict[str, torch.Tensor]) -> None:
        size = sum(t.numel() * t.element_size() for t in row.values())
        if size > self.cache_bytes:
            return
        old = self._cache.pop(key, None)
        if old is not None:
            self._cached_bytes -= sum(t.numel() * t.element_size()
                                      for t in old.values())
        self._cache[key] = row
        self._cached_bytes += size
        while self._cached_bytes > self.cache_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= sum(t.numel() * t.element_size()
                                      for t in evicted.values())

    def answer(self, timestep: torch.Tensor, guidance: Optional[torch.Tensor],
               pooled: Optional[torch.Tensor],
               dtype: Optional[torch.dtype] = None,
               extras: Optional[Dict[str, torch.Tensor]] = None
               ) -> Dict[str, torch.Tensor]:
        """{output: [N, ...]} for the rows the embedder received, in the
        served dtype, on the CPU.  `dtype`: the one the transformer runs in
        now (the served one unless it was moved with .to(dtype)): its
        pipeline's arithmetic is the one undone to find the scheduler's t.
        `extras`: the family's other inputs by name (PixArt-alpha's
        resolution and aspect_ratio, CogVideoX 1.5's ofs)."""
        found = self.rows(timestep, guidance, pooled, dtype, extras)
        return {name: found.take(name, None, (found.index.numel(),))
                for name in self.expected}

    # Under torch.compile the call to temb runs eagerly (a graph break):
    # dynamo cannot trace a network or native call, and the rows it returns
    # enter the compiled graph as inputs, new each step.
    @_not_compiled
    def rows(self, timestep: torch.Tensor, guidance: Optional[torch.Tensor],
             pooled: Optional[torch.Tensor],
             dtype: Optional[torch.dtype] = None,
             extras: Optional[Dict[str, torch.Tensor]] = None) -> _Answer:
        """As :meth:`answer`, but each distinct row once, with the index of
        each received row among them: Wan 2.2 TI2V's per-token timesteps
        ([B, seq], flattened) hold two distinct values, and neither the call
        nor the answer grows with the tokens."""
        dtype = dtype or self.dtype
        self._own()
        if self._prefetch is not None:
            self.wait()
        t_seen = timestep.detach().reshape(-1).to("cpu")
        g_seen = (None if guidance is None
                  else guidance.detach().reshape(-1).to("cpu"))
        p_rows = (None if pooled is None else pooled.detach().to(
            "cpu", self.dtype).reshape(-1, pooled.shape[-1]))
        e_rows, layout = self._extra_rows(extras, dtype)
        parts = (("timestep", t_seen), ("guidance", g_seen),
                 ("pooled_projections", p_rows), ("extra inputs", e_rows))
        # One timestep, guidance, pooled or extra row may stand for every
        # row.
        n = max(x.shape[0] for _, x in parts if x is not None)
        for name, x in parts:
            if x is not None and x.shape[0] not in (1, n):
                raise ValueError(f"offload_conditioning: {name} has "
                                 f"{x.shape[0]} rows, the batch {n}")
        # The distinct rows, compared as integers (the bits of t and
        # guidance, the bytes of pooled and extra rows); a part given once
        # is the same for every row.
        columns = []
        for x in (t_seen.to(torch.float32).view(torch.int32),
                  None if g_seen is None
                  else g_seen.to(torch.float32).view(torch.int32),
                  None if p_rows is None
                  else p_rows.contiguous().view(torch.uint8),
                  None if e_rows is None
                  else e_rows.contiguous().view(torch.uint8)):
            if x is not None and n > 1 and x.shape[0] == n:
                columns.append(x.reshape(n, -1).to(torch.int64))
        if columns:
            _, index = torch.unique(torch.cat(columns, 1), dim=0,
                                    return_inverse=True)
            count = int(index.max()) + 1
            first = torch.full((count,), n, dtype=torch.int64).scatter_reduce(
                0, index, torch.arange(n), "amin")
        else:
            index = torch.zeros(n, dtype=torch.int64)
            first = torch.zeros(1, dtype=torch.int64)

        def distinct(x):
            return None if x is None else x.expand(
                (n,) + tuple(x.shape[1:]))[first]

        t_seen, g_seen, p_rows, e_rows = map(distinct,
                                             (t_seen, g_seen, p_rows, e_rows))
        count = first.shape[0]
        t_bits = t_seen.to(torch.float32).view(torch.int32).tolist()
        g_bits = (None if g_seen is None
                  else g_seen.to(torch.float32).view(torch.int32).tolist())

        def row_bytes(x):
            if x is None:
                return [None] * count
            raw = x.contiguous().view(torch.uint8).numpy()
            return [raw[i].tobytes() for i in range(count)]

        p_keys, e_keys = row_bytes(p_rows), row_bytes(e_rows)
        keys = [(t_bits[i], None if g_bits is None else g_bits[i],
                 p_keys[i], e_keys[i]) for i in range(count)]
        with self._lock:
            # The hits are taken before the fetch, whose rows may evict
            # them from a cache smaller than the rows in play.
            found = {}
            for k in keys:
                row = self._cache.get(k)
                if row is not None:
                    self._cache.move_to_end(k)
                    found[k] = row
            missing = [i for i in range(count) if keys[i] not in found]
            if missing:
                found.update(self._fetch(keys, missing, t_seen, g_seen,
                                         p_rows, dtype, e_rows, layout))
            rows = [found[k] for k in keys]
        return _Answer({name: torch.stack([row[name] for row in rows])
                        for name in self.expected}, index)

    def row_dtype(self, name: str,
                  dtype: Optional[torch.dtype] = None) -> torch.dtype:
        """The dtype output `name` is kept and handed on in: float32 for
        the outputs a family computes in float32 (Wan's table sums), else
        the model's."""
        if name in self.family.float32_outputs:
            return torch.float32
        return dtype or self.dtype

    def _extra_rows(self, extras: Optional[Dict[str, torch.Tensor]],
                    dtype: torch.dtype
                    ) -> Tuple[Optional[torch.Tensor], List[Tuple[str, int]]]:
        """The extra inputs side by side as float32 rows [N, K], and their
        (name, width) layout.  Their pipelines pass them in the model's
        dtype, as the served model takes them; a value that dtype does not
        hold is not the pipeline's."""
        if not extras:
            return None, []
        values, layout = [], []
        for name in self.extra_inputs:
            value = torch.as_tensor(extras[name]).detach().to("cpu")
            value = value.reshape(value.shape[0] if value.dim() else 1, -1)
            exact = value.to(torch.float32)
            held = exact.to(dtype).to(torch.float32) == exact
            if not bool(held.all()):
                bad = exact[~held][0].item()
                raise ValueError(
                    f"offload_conditioning: the transformer received {name} "
                    f"{bad!r}, not a {dtype} value as "
                    "its pipeline passes it; is the transformer called the "
                    "way its pipeline calls it?")
            values.append(exact)
            layout.append((name, exact.shape[1]))
        rows = max(v.shape[0] for v in values)
        for (name, _), v in zip(layout, values):
            if v.shape[0] not in (1, rows):
                raise ValueError(f"offload_conditioning: {name} has "
                                 f"{v.shape[0]} rows, the batch {rows}")
        return torch.cat([v.expand(rows, -1) for v in values], 1), layout

    def _fetch(self, keys, missing, t_seen, g_seen, p_rows, dtype,
               e_rows=None, layout=()
               ) -> Dict[Tuple, Dict[str, torch.Tensor]]:
        family = self.family
        # The rows to ask for: the missing ones, and with a schedule every
        # step's row for each distinct (guidance, pooled, extras) of this
        # batch.
        wanted: collections.OrderedDict[Tuple, Tuple] = \
            collections.OrderedDict()
        first: Dict[Tuple, int] = {}
        for i in missing:
            wanted.setdefault(keys[i], ("seen", i))
        scheduled = []  # recorded once the call has answered
        if self._schedule is not None:
            for i, key in enumerate(keys):
                first.setdefault(key[1:], i)
            seen_t = family.timestep(self._schedule, dtype).to(torch.float32)
            s_bits = seen_t.view(torch.int32).tolist()
            for rest, i in first.items():
                if (dtype,) + rest in self._scheduled:
                    continue
                scheduled.append((dtype,) + rest)
                for s, bits in enumerate(s_bits):
                    key = (bits,) + rest
                    if key not in self._cache:
                        wanted.setdefault(key, ("schedule", s, i))
        t_values, g_values, p_index = [], [], []
        schedule_t = self._schedule
        seen_rows = [w[1] for w in wanted.values() if w[0] == "seen"]
        back = {}
        if seen_rows:
            values = _scheduler_values(t_seen[seen_rows], family.timestep,
                                       family.timestep_factor, dtype,
                                       "timestep")
            back = dict(zip(seen_rows, values.tolist()))
        g_back = {}
        if g_seen is not None:
            # Only a family with a guidance map receives guidance.
            assert family.guidance is not None
            distinct = sorted({w[-1] for w in wanted.values()})
            values = _scheduler_values(g_seen[distinct], family.guidance,
                                       family.guidance_factor, dtype,
                                       "guidance")
            g_back = dict(zip(distinct, values.tolist()))
        for w in wanted.values():
            row = w[-1]  # the batch row giving guidance and pooled
            if w[0] == "schedule":
                assert schedule_t is not None  # wanted only with a schedule
                t_values.append(schedule_t[w[1]].item())
            else:
                t_values.append(back[w[1]])
            if g_seen is not None:
                g_values.append(g_back[row])
            p_index.append(row)
        timesteps = torch.tensor(t_values, dtype=torch.float32)
        guidance = (torch.tensor(g_values, dtype=torch.float32)
                    if g_seen is not None else None)
        pooled = p_rows[p_index].contiguous() if p_rows is not None else None
        extras = {}
        if e_rows is not None:
            at = 0
            for name, width in layout:
                value = e_rows[p_index, at:at + width].contiguous()
                extras[name] = value[:, 0] if width == 1 else value
                at += width
        result = self._request(timesteps, guidance, pooled, extras)
        self._scheduled.update(scheduled)
        fetched = {}
        for j, key in enumerate(wanted):
            row = {name: result[name][j].to(self.row_dtype(name)).clone()
                   for name in self.expected}
            self._store(key, row)
            fetched[key] = row
        # This step's rows come from here even when the cache is smaller
        # than the schedule (or off: cache_bytes=0).
        return fetched

    # copy.deepcopy: the copy shares the caller's client, copies the rest.
    def __deepcopy__(self, memo: Dict[int, Any]) -> OffloadedConditioning:
        self.wait()
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        state = self.__dict__.copy()
        shared = {name: state.pop(name)
                  for name in ("_client", "_recipe", "_lock", "family")}
        del state["_per_thread"]
        clone.__dict__.update(copy.deepcopy(state, memo))
        clone.__dict__.update(shared)
        clone._lock = threading.Lock()
        clone._per_thread = threading.local()
        return clone

    # pickle: the recipe travels, never a live channel; the cache too.
    def __getstate__(self) -> Dict[str, Any]:
        self.wait()
        state = self.__dict__.copy()
        state["_client"] = None
        state["_lock"] = None
        del state["_per_thread"]
        try:
            pickle.dumps(self._recipe)
        except Exception as e:
            raise TypeError(
                "this offloaded transformer cannot be pickled: its client "
                f"({type(self._client).__name__}) cannot be reopened from "
                "pickled settings") from e
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._per_thread = threading.local()
        self._pid = -1  # reopen on first use
        self._owner_pid = os.getpid()


# --- the modules ------------------------------------------------------------

def _product(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


class _Answer:
    """A step's answer: each distinct row once ({output: [U, ...]}) and, for
    each row the embedder received, which of them it is (`index`, [N]).
    A module reads its part with take(), as the shape it replaces."""

    def __init__(self, rows: Dict[str, torch.Tensor],
                 index: torch.Tensor) -> None:
        self.rows = rows
        self.index = index

    def to(self, device: Any,
           dtypes: Dict[str, torch.dtype]) -> _Answer:
        return _Answer({name: value.to(device=device, dtype=dtypes[name],
                                       non_blocking=True)
                        for name, value in self.rows.items()},
                       self.index.to(device, non_blocking=True))

    def first(self, count: int) -> _Answer:
        """The answer for the first `count` rows received."""
        return _Answer(self.rows, self.index[:count])

    def fits(self, lead: Sequence[int]) -> bool:
        return self.index.numel() in (1, _product(lead))

    def take(self, name: str, block: Optional[int],
             lead: Sequence[int]) -> torch.Tensor:
        """Output `name` (block `block` of it) for rows laid out as `lead`
        (the received rows, [N] or Wan 2.2 TI2V's [B, seq])."""
        value = self.rows[name]
        if block is not None:
            value = value[:, block]
        index = self.index
        if index.numel() == 1:
            index = index.expand(_product(lead))
        return value[index.reshape(tuple(lead))]


class ConditioningEmbedder(torch.nn.Module):
    """Stands in for a transformer's ``time_text_embed``: returns the
    step's ``temb`` rows served by temb, with every output of the step
    attached for the modulation modules.  No parameters; one zero-size
    buffer follows ``.to(dtype)`` so that the answer comes in the module's
    dtype, on the timestep's device."""

    dtype_marker: torch.Tensor  # a buffer (register_buffer below)

    def __init__(self, state: OffloadedConditioning) -> None:
        super().__init__()
        self.state = state
        self.register_buffer("dtype_marker",
                             torch.empty(0, dtype=state.dtype),
                             persistent=False)

    def forward(self, *args: Any, **kwargs: Any
                ) -> Union[torch.Tensor,
                           Tuple[torch.Tensor, Optional[torch.Tensor]]]:
        names = self.state.family.arguments
        given = dict(zip(names, args))
        for name, value in kwargs.items():
            given["pooled" if name in _POOLED_NAMES else name] = value
        given.pop("-", None)
        self._add_tapped(given)
        timestep = given["timestep"]
        if not isinstance(timestep, torch.Tensor):
            timestep = torch.as_tensor(timestep)
        dtype = self.dtype_marker.dtype
        state = self.state
        extras = {}
        for name in state.extra_inputs:
            if given.get(name) is None:
                raise ValueError(
                    f"offload_conditioning: the {state.family.name} "
                    f"transformer was called without {name!r}, which its "
                    "conditioning model takes")
            extras[name] = given[name]
        answer = state.rows(timestep, given.get("guidance"),
                            given.get("pooled"), dtype, extras or None)
        answer = answer.to(timestep.device,
                           {name: state.row_dtype(name, dtype)
                            for name in answer.rows})
        rows = (answer.index.numel(),)
        temb = answer.take(state.described.temb_output, None, rows)
        setattr(temb, _ANSWER, answer)
        state.set_current(answer)
        if not state.family.returns_pair:
            return temb
        second = None
        if state.family.second:
            of_second = _Answer({read: answer.rows[served]
                                 for read, served in state.family.second},
                                answer.index)
            second = of_second.take(state.family.second[0][0], None, rows)
            setattr(second, _ANSWER, of_second)
        return temb, second

    def _add_tapped(self, given: Dict[str, Any]) -> None:
        """Completes `given` with what the taps recorded since the last
        answer, and cuts the pooled row out of a wider argument."""
        state = self.state
        tapped = state.take_tapped()
        pooled = given.get("pooled")
        if state.pooled_columns is not None and pooled is not None:
            pooled = given["pooled"] = pooled[..., :state.pooled_columns]
        for path, name in state.taps:
            if name not in tapped:
                where = path or "the transformer's forward"
                raise RuntimeError(
                    f"offload_conditioning: {where} did not run before the "
                    f"{state.family.name} model's embedder; is the model "
                    "called the way its pipeline calls it?")
            value = tapped[name]
            if (path and name in state.extra_inputs and value is not None
                    and pooled is not None):
                # A module receives the rows flattened (add_time_proj sees
                # time_ids.flatten()): one row per pooled row.
                value = torch.as_tensor(value).reshape(pooled.shape[0], -1)
            given.setdefault("pooled" if name in _POOLED_NAMES else name,
                             value)

    def extra_repr(self) -> str:
        return f"model={self.state.model!r}, family={self.state.family.name}"


class PassThrough(torch.nn.Module):
    """Stands in for the SiLU before a modulation Linear: the Linear's
    replacement reads the embedder's answer from the tensor itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ModulationLookup(torch.nn.Module):
    """Stands in for a modulation Linear: output `output` at block position
    `index` of the step's answer, exactly what the Linear computed.  A
    zero-size buffer keeps the Linear's dtype, for models that read it
    (MiniMax-H3 casts the Linear's input to it)."""

    dtype_marker: torch.Tensor  # a buffer (register_buffer below)

    def __init__(self, state: OffloadedConditioning, output: str,
                 index: Optional[int],
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.state = state
        self.output = output
        self.index = index
        self.register_buffer("dtype_marker", torch.empty(0, dtype=dtype),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        answer = getattr(x, _ANSWER, None)
        lead = x.shape[:-1]
        if answer is None:
            # The tensor was rebuilt on the way (a dtype cast, Wan 2.2
            # TI2V's unflatten, CogVideoX's ofs sum, in the UNet the
            # resnet's SiLU of its sum emb): the step's answer is still the
            # embedder's latest one.
            answer = self.state.current()
            if (answer is not None and self.state.family.zero_rows
                    and answer.index.numel() == 2 * _product(lead)):
                # The rows of t, without those of t * 0 (zero_rows).
                answer = answer.first(_product(lead))
            if answer is None or not answer.fits(lead):
                raise RuntimeError(
                    f"offload_conditioning: {self.output}"
                    f"{'' if self.index is None else f'[{self.index}]'} was "
                    "called with a tensor that is not the replaced "
                    f"{self.state.described.embedder}'s output")
        # Rows as the Linear gives them: [..., W] (Wan's [N, 6, D] flat).
        value = answer.take(self.output, self.index, lead).flatten(len(lead))
        return value.to(x.dtype) if value.dtype != x.dtype else value

    def extra_repr(self) -> str:
        return f"output={self.output!r}, index={self.index}"


# --- the table and video families' modules ----------------------------------

class Carrier(torch.nn.Module):
    """Stands in for a module with weights whose result the served temb
    already is (Wan's time_embedder, CogVideoX's time_embedding): returns
    its input.  Wan's embedding reads its time MLP's parameters' dtype to
    cast to, so there it holds one zero-size parameter in the model's
    dtype: the cast is then a no-op and no byte is held."""

    def __init__(self, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        if dtype is not None:
            self.dtype_marker = torch.nn.Parameter(
                torch.empty(0, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any
                ) -> torch.Tensor:
        return x


class ZeroContribution(torch.nn.Module):
    """Stands in for an embedding that the model adds to temb and that the
    served temb already includes (CogVideoX 1.5's ofs_embedding): adds
    -0.0, which leaves every value as it is."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any
                ) -> torch.Tensor:
        return x.new_full((1, 1), -0.0)


class TableLookup(torch.nn.Module):
    """Stands in for an additive ``scale_shift_table`` parameter (Wan,
    PixArt, LTX-Video).  The model adds the table to its modulation (a
    block's) or to temb (the output's); the stand-in's sum is output
    `output` at block position `index` of the step's answer, which is that
    sum, laid out as the model's addend is ([N, k, D], or [B, seq, k, D]
    per token).  It takes the indexing, unsqueeze, ``.to()`` and
    ``.device`` the models apply to their table on the way, and keeps the
    table's dtype for the sum's type promotion."""

    dtype_marker: torch.Tensor  # a buffer (register_buffer below)

    def __init__(self, state: OffloadedConditioning, output: str,
                 index: Optional[int], dtype: torch.dtype,
                 shape: Tuple[int, ...] = ()) -> None:
        super().__init__()
        self.state = state
        self.output = output
        self.index = index
        # The table's shape, which LTX-Video reads (its row count is the
        # number of chunks).
        self.shape = torch.Size(shape)
        self.register_buffer("dtype_marker", torch.empty(0, dtype=dtype),
                             persistent=False)

    @property
    def device(self) -> torch.device:
        return self.dtype_marker.device

    def __getitem__(self, item: Any) -> TableLookup:
        # table[None] (PixArt), table[None, None] (LTX-Video).
        if item is None or item in ((None,), (None, None)):
            return self
        raise TypeError(f"offload_conditioning: {self.output} table indexed "
                        f"with {item!r}")

    def unsqueeze(self, dim: int) -> TableLookup:
        return self

    def __add__(self, other: torch.Tensor) -> torch.Tensor:
        answer = self.state.current()
        lead = other.shape[:-2]
        if answer is None or not answer.fits(lead):
            raise RuntimeError(
                f"offload_conditioning: the {self.output} table was added to "
                f"a {list(other.shape)} tensor that is not of the replaced "
                "embedder's latest step")
        value = answer.take(self.output, self.index, lead)
        dtype = torch.promote_types(self.dtype_marker.dtype, other.dtype)
        return value.to(dtype) if value.dtype != dtype else value

    __radd__ = __add__

    def extra_repr(self) -> str:
        return f"output={self.output!r}, index={self.index}"


class InputTap:
    """A forward pre-hook recording one of the served inputs for the
    embedder (_Family.taps): on the transformer itself, its forward's
    argument `name` (None when not given: the embedder then refuses the
    call); on a parameterless module, its first argument.  The module runs
    as before."""

    def __init__(self, state: OffloadedConditioning, name: str,
                 whole_forward: bool) -> None:
        self.state = state
        self.name = name
        self.whole_forward = whole_forward

    def __call__(self, module: torch.nn.Module, args: Tuple[Any, ...],
                 kwargs: Dict[str, Any]) -> None:
        if not self.whole_forward:
            value = args[0] if args else next(iter(kwargs.values()))
        elif self.name in kwargs:
            value = kwargs[self.name]
        else:
            value = inspect.signature(module.forward).bind_partial(
                *args, **kwargs).arguments.get(self.name)
        self.state.record_tap(self.name, value)


# --- patching ---------------------------------------------------------------

def _owned_bytes(
        modules: Sequence[Union[torch.nn.Module, torch.Tensor]]) -> int:
    seen = set()
    total = 0
    for module in modules:
        tensors = ([module] if isinstance(module, torch.Tensor) else
                   list(module.parameters()) + list(module.buffers()))
        for tensor in tensors:
            if tensor.is_meta:
                continue
            key = (tensor.untyped_storage().data_ptr(), tensor.device)
            if key in seen:
                continue
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
    return total


def _set(model: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, module)


def conditioning_modules(transformer: torch.nn.Module, served: Any
                         ) -> Dict[str, Any]:
    """The modules with weights that offload_conditioning replaces, by
    qualified name, as the served conditioning model `served` (a
    ConditioningModel of ``client.models()``) describes them: the embedder
    (where it has weights), every modulation Linear, the folded modules,
    and the additive tables (as their Parameters).  Works on the meta
    device, so the bytes a released config frees can be counted without
    its weights."""
    described = _replaced(served)
    found: Dict[str, Any] = {}
    embedder = transformer.get_submodule(described.embedder)
    if any(True for _ in embedder.parameters()):
        found[described.embedder] = embedder
    for path in described.modules()[1:]:
        is_table = any(table.table == path for table in described.tables)
        found[path] = (transformer.get_parameter(path) if is_table
                       else transformer.get_submodule(path))
    return found


def offload_conditioning(transformer: torch.nn.Module, *, client: Any,
                         model: str, schedule: Any = None,
                         cache_bytes: int = 1 << 30,
                         timeout: Optional[float] = None
                         ) -> OffloadedConditioning:
    """Replaces, in place, the time conditioning of a diffusers
    transformer (QwenImageTransformer2DModel incl. Edit-2511's zero_cond_t,
    FluxTransformer2DModel dev or schnell, SD3Transformer2DModel,
    WanTransformer3DModel 2.1/2.2 incl.
    TI2V's per-token timesteps, PixArtTransformer2DModel Sigma or alpha,
    CogVideoXTransformer3DModel incl. 1.5's ofs, Flux2Transformer2DModel
    dev or klein, HunyuanVideo15Transformer3DModel, AuraFlow's and
    MiniMax-H3's, and the others docs/offload.md lists) or of SDXL's
    UNet2DConditionModel with temb's answers from the conditioning model
    `model`, and releases the weights of the modules its description names.

    Args:
      transformer: the model, called afterwards as its pipeline calls it.
      client: any object with ``condition(model, timesteps, guidance=,
        pooled_projections=, outputs=, return_tensors="pt")`` and
        ``models()`` (a temb.Client, temb.local).  The served model's
        description names the modules replaced, and is checked against the
        transformer now.  Pickled or forked copies reopen an equal client.
      model: the conditioning model's name on the server.
      schedule: the scheduler's timesteps of the coming loop; the first
        step then fetches all of them in one call (see
        :meth:`OffloadedConditioning.set_schedule`).
      cache_bytes: the bound of the client-side row cache (LRU), keyed by
        the exact bits of what the embedder receives.
      timeout: passed to each call where given.

    Returns the shared :class:`OffloadedConditioning` (its ``calls``,
    ``freed_bytes``, ``set_schedule``).  Raises ValueError naming what
    differs when the served model does not match the transformer.
    """
    from temb import local
    if client is local:  # the module: its default engine, in this process
        client = local.default_engine()
    if not (hasattr(client, "condition") and hasattr(client, "models")):
        raise TypeError("offload_conditioning needs a client with "
                        "condition() and models() methods (temb.Client, "
                        f"temb.local), got {type(client).__name__}")
    family = _family_of(transformer)
    if any(isinstance(m, ConditioningEmbedder) for m in transformer.modules()):
        raise ValueError("offload_conditioning: this transformer is already "
                         "offloaded")
    served = _served_model(client, model)
    described = _replaced(served)
    slots = described.slots
    tables = described.tables
    stand_ins = described.stand_ins
    missing = _missing_modules(transformer, described)
    if missing:
        raise ValueError(
            f"offload_conditioning: temb model {model!r} (family "
            f"{getattr(served, 'family', '') or 'unknown'}) does not match "
            f"the {family.name} transformer: " + "; ".join(missing))
    typed = transformer.get_submodule(family.dtype_module
                                      or described.embedder)
    dtype = next(p.dtype for p in typed.parameters())
    device = next(typed.parameters()).device
    expected: Dict[str, Tuple[int, ...]] = {}
    counts: Dict[str, int] = collections.Counter()
    for slot in slots:
        linear = transformer.get_submodule(slot.linear)
        if not isinstance(linear, torch.nn.Linear):
            raise ValueError(f"offload_conditioning: {slot.linear} is a "
                             f"{type(linear).__name__}, not a Linear")
        width = linear.out_features
        if slot.index is None:
            expected[slot.output] = (width,)
        else:
            counts[slot.output] += 1
            expected[slot.output] = (counts[slot.output], width)
    # A table's rows are the table's shape ([1, 6, D] for a Wan block)
    # flattened.
    for table in tables:
        width = transformer.get_parameter(table.table).numel()
        if table.index is None:
            expected[table.output] = (width,)
        else:
            counts[table.output] += 1
            expected[table.output] = (counts[table.output], width)
    expected[described.temb_output] = (
        (family.temb_width(transformer),) if family.temb_width is not None
        else (cast(torch.nn.Linear,  # checked above
                   transformer.get_submodule(slots[-1].linear)).in_features,))
    for read, second in family.second:
        expected[second] = expected[read]
    extra_inputs = (family.extra_inputs(transformer)
                    if family.extra_inputs is not None else ())
    state = OffloadedConditioning(family, described, client, model, expected,
                                  dtype, cache_bytes, timeout, extra_inputs)
    if family.pooled_width is not None:
        state.pooled_columns = family.pooled_width(transformer)
    state.fingerprints = _weight_fingerprints(transformer, served)
    state.check_served_model(served)
    state.set_schedule(schedule)

    old = [transformer.get_submodule(described.embedder)] + [
        transformer.get_submodule(slot.linear) for slot in slots] + [
        transformer.get_submodule(s.path) for s in stand_ins] + [
        transformer.get_parameter(table.table) for table in tables]
    state.freed_bytes = _owned_bytes(old)
    del old
    embedder = ConditioningEmbedder(state).to(device)
    _set(transformer, described.embedder, embedder)
    state.replaced.append(described.embedder)
    for slot in slots:
        if slot.silu is not None:
            _set(transformer, slot.silu, PassThrough())
            state.replaced.append(slot.silu)
        weight = cast(torch.nn.Linear,  # checked above
                      transformer.get_submodule(slot.linear)).weight
        _set(transformer, slot.linear,
             ModulationLookup(state, slot.output, slot.index,
                              weight.dtype).to(weight.device))
        del weight
        state.replaced.append(slot.linear)
    # The other stand-ins, the tables and the taps.
    for stand_in in stand_ins:
        replacement = (ZeroContribution() if stand_in.kind == "adds_nothing"
                       else Carrier(dtype))
        _set(transformer, stand_in.path, replacement.to(device))
        state.replaced.append(stand_in.path)
    for table in tables:
        parent_path, _, name = table.table.rpartition(".")
        parent = (transformer.get_submodule(parent_path) if parent_path
                  else transformer)
        parameter = getattr(parent, name)
        lookup = TableLookup(state, table.output, table.index,
                             parameter.dtype, parameter.shape).to(
                                 parameter.device)
        del parameter
        delattr(parent, name)
        setattr(parent, name, lookup)
        state.replaced.append(table.table)
    state.taps = tuple(tap for tap in family.taps
                       if tap[1] in ("timestep", "guidance")
                       or tap[1] in _POOLED_NAMES or tap[1] in extra_inputs)
    for path, name in state.taps:
        transformer.get_submodule(path).register_forward_pre_hook(
            InputTap(state, name, whole_forward=not path), with_kwargs=True)
    return state
