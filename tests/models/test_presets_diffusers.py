"""Every temb preset against diffusers' own code (diffusers 0.42.1, torch on
the CPU): the module or function each model family calls, built from
diffusers' classes (small sizes where a class also holds MLP weights) or
with the arguments diffusers' model passes, never re-implemented here.

What each preset is compared with, on the timesteps temb receives:
the family's sinusoid module applied to what the model feeds it.  For
presets with time_factor (flux, chroma, z-image, longcat, t5-film, cosmos3
and the like) that is the module on ``t * time_factor`` computed in float32
(what the model does; bf16 pipelines are covered with timestep_dtype
below); where the model scales t itself (Ideogram 4, Stable Cascade, RFD4,
Krea 2, Qwen-Image 2.1) its own code does.

Tolerances (float32 results).  temb's fp32 path follows PyTorch's op order
(``fl32(fl32(-ln P) * i) / fl32(H - shift)``, or ``fl32(i * fl32(-ln P /
(H - shift)))`` for the slope-first families, exp, ``fl32(t * f)``, then
scale), so its angle a = scale * t * f differs from PyTorch's only where the
two exps round a frequency differently (temb's exp is correctly rounded;
PyTorch's CPU exp on x86 is oneMKL's, measured within 0.56 ulp, rounding
0.56% of float32 exponents in [-10, 0] the other way): then fl32(t * f)
moves by about one ulp of a, and sin/cos (both within 1 ulp of the output)
follow it.  So

    |temb - diffusers| <= ULPS * ulp32(max(|a_max|, 1))     per row,

with a_max the row's largest angle (|scale * time_factor * t| * f_max;
f_max = 1 for the exp law, 2*pi*10000 for Stable Audio 3) and ULPS = 4
("a few ulp of the angle").  Float64 families (Wan 2.1's original
code, SkyReels-V2) compare fp64 results against diffusers' float64 sinusoid
(written 1/10000**(i/H), not exp) within FP64_ULPS = 16 ulp64 of the
angle.  The
measured maxima are printed in the summary of a pytest run.

bf16 and fp16 results must equal diffusers' float32 result cast with
``.to(dtype)`` in at least 99.9% of elements over the family's natural
range of t (steps for most, sigmas for the sigma families: an angle of
1000 * 1000 rad has an ulp of 0.06, so casts of out-of-range sigmas are
measured but not asserted).  The casts differ where an ulp-of-the-angle
difference moves a value across a rounding boundary, so the fraction
depends on the angles and on which frequencies the two exps round
differently.  Measured exceptions, each with its own floor (EQUAL_FLOORS):
fp16 of ldm at dim 64, dit-diffusers and kandinsky3 (their one
differently rounded frequency is a high one, f ~ 0.7: at t ~ 1000 its
ulp-of-angle difference is 1/8 of an fp16 ulp and flips about one element
in eight of its two columns: 99.81-99.89%); Stable Audio 3 (angles up to
2*pi*10^4 rad, whose ulp exceeds half a bf16 ulp, and a frequency table
that differs from PyTorch's CPU one in 11 of 128 entries: exp roundings,
and ramp values where torch.linspace's vectorised x86 CPU kernel rounds
differently from the element formula that temb follows).  The exp part of
these floors is what a correctly rounded exp gives against oneMKL's, and
is not reachable without reproducing that closed-source library.

Timesteps: {0, 1, 17.5, 250, 999, 1000} and 16 random ones in [0, 1000];
families whose t is a sigma in [0, 1] also get {0, 0.001, 0.0175, 0.25,
0.999, 1} and 16 random sigmas; families with size-like conditioning get
their natural values too.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, Optional, Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
from diffusers.models import embeddings as E  # noqa: E402

STEPS = np.float32([0, 1, 17.5, 250, 999, 1000])
SIGMAS = np.float32([0, 0.001, 0.0175, 0.25, 0.999, 1.0])
_RNG = np.random.default_rng(20251124)
RANDOM_STEPS = _RNG.uniform(0, 1000, 16).astype(np.float32)
RANDOM_SIGMAS = _RNG.uniform(0, 1, 16).astype(np.float32)

ULPS = 4.0
FP64_ULPS = 16.0
MIN_EQUAL_FRACTION = 0.999
# Measured exceptions to MIN_EQUAL_FRACTION over the natural range (see the
# module docstring): preset -> {dtype name: floor}.
EQUAL_FLOORS = {
    "ldm": {"float16": 0.998},             # measured 0.99858 (dim 64)
    "dit-diffusers": {"float16": 0.998},   # measured 0.99893
    "kandinsky3": {"float16": 0.998},      # measured 0.99811
    "stable-audio-3": {"bfloat16": 0.98, "float16": 0.96},      # 0.98757, 0.96875
}


def _defaults(cls):
    """The default arguments of a diffusers model class: its config."""
    return {name: p.default for name, p in
            inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _module(name, attribute=None):
    import importlib
    module = importlib.import_module(f"diffusers.models.{name}")
    return module if attribute is None else getattr(module, attribute)


@dataclasses.dataclass(frozen=True)
class Case:
    # The diffusers code, for the reader and the failure messages.
    source: str
    # Builds f(t) -> embedding: t is a float32 tensor of what temb is sent.
    reference: Callable[[], Callable]
    sigma: bool = False        # the family's t is a sigma in [0, 1]
    extra: Tuple[float, ...] = ()
    ulps: float = ULPS
    dim: Optional[int] = None  # for presets without a default dim
    fp64: bool = False         # a float64 family: compare fp64 results


def _fn(module, factor=None):
    if factor is None:
        return module
    return lambda t: module(t * factor)  # float32, as the model does


# --- the references ----------------------------------------------------------

def _unet_time_proj():
    cfg = _defaults(_module("unets.unet_2d_condition", "UNet2DConditionModel"))
    # unet_2d_condition.py:569 Timesteps(block_out_channels[0], flip, freq_shift)
    return E.Timesteps(cfg["block_out_channels"][0], cfg["flip_sin_to_cos"],
                       cfg["freq_shift"])


def _unet_add_time_proj():
    cfg = _defaults(_module("unets.unet_2d_condition", "UNet2DConditionModel"))
    # unet_2d_condition.py:684; SDXL configs: addition_time_embed_dim 256.
    return E.Timesteps(256, cfg["flip_sin_to_cos"], cfg["freq_shift"])


def _ddpm():
    # unets/unet_2d.py:150 Timesteps(block_out_channels[0], flip, freq_shift)
    # with google/ddpm-* configs: 128, flip_sin_to_cos False, freq_shift 1.
    return E.Timesteps(128, False, 1)


def _interleaved_transformer_pe():
    def pe(t):
        halves = E.get_timestep_embedding(t, 512, flip_sin_to_cos=False,
                                          downscale_freq_shift=0)
        out = torch.empty_like(halves)
        out[:, 0::2], out[:, 1::2] = halves[:, :256], halves[:, 256:]
        return out
    return pe


def _float64_sinusoid():
    return _module("transformers.transformer_skyreels_v2",
                   "SkyReelsV2Timesteps")(256, True)


def _cogvideox():
    cfg = _defaults(_module("transformers.cogvideox_transformer_3d",
                            "CogVideoXTransformer3DModel"))
    inner = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    return E.Timesteps(inner, cfg["flip_sin_to_cos"], cfg["freq_shift"])


def _kandinsky5():
    module = _module("transformers.transformer_kandinsky",
                     "Kandinsky5TimeEmbeddings")(2048, 8)
    module.in_layer = module.activation = module.out_layer = torch.nn.Identity()
    return module


def _kandinsky3():
    cfg = _defaults(_module("unets.unet_kandinsky3", "Kandinsky3UNet"))
    # unet_kandinsky3.py:70-71
    return E.Timesteps(cfg["block_out_channels"][0] // 2, False, 1)


def _ernie():
    cfg = _defaults(_module("transformers.transformer_ernie_image",
                            "ErnieImageTransformer2DModel"))
    return E.Timesteps(cfg["hidden_size"], False, 0)  # transformer_ernie_image.py:328


def _omnigen():
    cfg = _defaults(_module("transformers.transformer_omnigen",
                            "OmniGenTransformer2DModel"))
    return E.Timesteps(cfg["time_step_dim"], cfg["flip_sin_to_cos"],
                       cfg["downscale_freq_shift"])


def _prx():
    cfg = _defaults(_module("transformers.transformer_prx", "PRXTransformer2DModel"))
    # transformer_prx.py:779-788: time_factor is get_timestep_embedding's scale
    return lambda t: E.get_timestep_embedding(
        t, 256, flip_sin_to_cos=True, downscale_freq_shift=0,
        scale=cfg["time_factor"], max_period=cfg["time_max_period"])


def _chroma():
    module = _module("transformers.transformer_chroma",
                     "ChromaCombinedTimestepTextProjEmbeddings")(16, 344)
    # [B, 344, 64] = (time 16 | guidance 16) repeated, then the mod table.
    return lambda t: module(t * 1000.0)[:, 0, :16]


def _t5_film():
    return lambda t: E.get_timestep_embedding(t * 2000.0, 768, max_period=2000.0)



def _embedding_fed_to(module, layer):
    """f(t): `module`'s own forward on t, returning what its MLP's first
    `layer` receives: the model's embedding, computed by its own code.  The
    MLP is replaced by identities first (it holds the only weights)."""
    for name in ("mlp_in", "mlp_out", "linear_1", "linear_2"):
        if hasattr(module, name):
            setattr(module, name, torch.nn.Identity())
    fed = []
    getattr(module, layer).register_forward_pre_hook(
        lambda _, args: fed.append(args[0]))

    def run(t, *args):
        fed.clear()
        module(t, *args)
        return fed[0]
    return run


def _ideogram4():
    cfg = _defaults(_module("transformers.transformer_ideogram4",
                            "Ideogram4Transformer2DModel"))
    hidden = cfg["attention_head_dim"] * cfg["num_attention_heads"]
    with torch.device("meta"):  # the MLP's weights are never used
        # transformer_ideogram4.py: Ideogram4EmbedScalar(hidden_size, (0.0, 1.0))
        module = _module("transformers.transformer_ideogram4",
                         "Ideogram4EmbedScalar")(hidden, input_range=(0.0, 1.0))
    return _embedding_fed_to(module, "mlp_in")


def _stable_cascade():
    import types
    cls = _module("unets.unet_stable_cascade", "StableCascadeUNet")
    width = _defaults(cls)["timestep_ratio_embedding_dim"]
    # get_timestep_ratio_embedding reads only the config's width.
    owner = types.SimpleNamespace(
        config=types.SimpleNamespace(timestep_ratio_embedding_dim=width))
    return lambda t: cls.get_timestep_ratio_embedding(owner, t)


def _rfd4():
    module = _module("transformers.transformer_rfd4_proteina")
    width = _defaults(module.RFD4ProteinaTransformer)["t_emb_dim"]
    return lambda t: module.get_rfd4_time_embedding(t, width)


# CogView4-6B's transformer: 32 heads of 128 (its released config; the
# class's own defaults, 64 x 40, are CogView3-Plus's width).
COGVIEW4_6B_INNER_DIM = 32 * 128


def _cogview_embeddings(model_class, inner_dim=None):
    cfg = _defaults(_module(*model_class))
    inner = inner_dim or cfg["num_attention_heads"] * cfg["attention_head_dim"]
    # transformer_cogview4.py:681 / transformer_cogview3plus.py:196:
    # timesteps_dim=inner_dim, condition_dim from the config.
    return E.CogView3CombinedTimestepSizeEmbeddings(
        32, cfg["condition_dim"], 6 * cfg["condition_dim"], inner)


def _cogview4():
    return _cogview_embeddings(
        ("transformers.transformer_cogview4", "CogView4Transformer2DModel"),
        COGVIEW4_6B_INNER_DIM).time_proj


def _cogview3_plus():
    return _cogview_embeddings(
        ("transformers.transformer_cogview3plus",
         "CogView3PlusTransformer2DModel")).time_proj


def _glm_image():
    module = _module("transformers.transformer_glm_image")
    cfg = _defaults(module.GlmImageTransformer2DModel)
    # transformer_glm_image.py:576: timesteps_dim=time_embed_dim
    return module.GlmImageCombinedTimestepSizeEmbeddings(
        32, cfg["condition_dim"], 4 * cfg["condition_dim"],
        cfg["time_embed_dim"]).time_proj


def _nucleusmoe():
    module = _module("transformers.transformer_nucleusmoe_image")
    cfg = _defaults(module.NucleusMoEImageTransformer2DModel)
    inner = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    return module.NucleusMoETimestepProjEmbeddings(inner).time_proj


def _cosmos3():
    module = _module("transformers.transformer_cosmos3")
    scale = _defaults(module.Cosmos3OmniTransformer)["timestep_scale"]
    # transformer_cosmos3.py: time_proj(timesteps * timestep_scale)
    return _fn(E.Timesteps(num_channels=256, flip_sin_to_cos=True,
                           downscale_freq_shift=0), scale)


def _flux3():
    cfg = _defaults(_module("transformers.transformer_flux3",
                            "Flux3Transformer2DModel"))
    return _fn(E.Timesteps(cfg["timestep_channels"], True, 0), 1000.0)


def _krea2():
    module = _module("transformers.transformer_krea2")
    width = _defaults(module.Krea2Transformer2DModel)["timestep_embed_dim"]
    embed = _embedding_fed_to(module.Krea2TimestepEmbedding(width, 8), "linear_1")
    # Its forward gives [B, 1, width] (one row per sample, broadcast later).
    return lambda t: embed(t, torch.float32)[:, 0, :]


def _qwen_image_21():
    return _module("transformers.transformer_qwenimage21",
                   "QwenImage21TemporalTimesteps")(timestep_dim=256)


def _bria_fibo2():
    module = _module("transformers.transformer_bria_fibo2")
    t_scale = _defaults(module.BriaFibo2Transformer2DModel)["t_scale"]
    embedder = module.TimestepEmbedder(32)
    # transformer_bria_fibo2.py:538: t_embedder(timestep * t_scale)
    return lambda t: embedder.timestep_embedding(
        t * t_scale, embedder.frequency_embedding_size)


CASES = {
    "sd15": Case("UNet2DConditionModel.time_proj", _unet_time_proj),
    "sd21": Case("UNet2DConditionModel.time_proj", _unet_time_proj),
    "sdxl": Case("UNet2DConditionModel.time_proj", _unet_time_proj),
    "sdxl-add-time": Case("UNet2DConditionModel.add_time_proj (256)",
                          _unet_add_time_proj,
                          extra=(1024, 768, 0, 512, 1536, 2048, 4096)),
    "ddpm": Case("UNet2DModel.time_proj (google/ddpm-*)", _ddpm),
    "dit": Case("get_timestep_embedding(t, 256, True, 0) (original DiT's op order)",
                lambda: lambda t: E.get_timestep_embedding(t, 256, True, 0)),
    "dit-diffusers": Case("CombinedTimestepLabelEmbeddings.time_proj",
                          lambda: E.CombinedTimestepLabelEmbeddings(10, 32).time_proj),
    "pixart": Case("PixArtAlphaCombinedTimestepSizeEmbeddings.time_proj",
                   lambda: E.PixArtAlphaCombinedTimestepSizeEmbeddings(48, 16, True).time_proj,
                   extra=(1024, 768, 0.75, 1.3333, 2048)),
    "sd3": Case("CombinedTimestepTextProjEmbeddings.time_proj",
                lambda: E.CombinedTimestepTextProjEmbeddings(32, 32).time_proj),
    "hunyuan-video": Case(
        "HunyuanVideoConditionEmbedding.time_proj",
        lambda: _module("transformers.transformer_hunyuan_video",
                        "HunyuanVideoConditionEmbedding")(32, 32, True).time_proj),
    "wan": Case("float64 sinusoid (SkyReelsV2Timesteps: get_1d_sincos_pos_embed_from_grid)",
                _float64_sinusoid, fp64=True),
    "wan-diffusers": Case(
        "WanTimeTextImageEmbedding.timesteps_proj",
        lambda: _module("transformers.transformer_wan", "WanTimeTextImageEmbedding")(
            dim=32, time_freq_dim=256, time_proj_dim=192, text_embed_dim=32).timesteps_proj),
    "flux": Case("CombinedTimestepGuidanceTextProjEmbeddings.time_proj(t * 1000)",
                 lambda: _fn(E.CombinedTimestepGuidanceTextProjEmbeddings(32, 32).time_proj,
                             1000.0), sigma=True),
    "transformer": Case("get_timestep_embedding(t, 512, False, 0), interleaved",
                        _interleaved_transformer_pe),
    "ldm": Case("get_timestep_embedding(t, 64, True, 0)",
                lambda: lambda t: E.get_timestep_embedding(t, 64, True, 0), dim=64),
    "diffusers-default": Case("get_timestep_embedding(t, 64) (defaults)",
                              lambda: lambda t: E.get_timestep_embedding(t, 64), dim=64),
    "flux2": Case(
        "Flux2TimestepGuidanceEmbeddings.time_proj(t * 1000)",
        lambda: _fn(_module("transformers.transformer_flux2",
                            "Flux2TimestepGuidanceEmbeddings")(256, 32).time_proj, 1000.0),
        sigma=True),
    "qwen-image": Case(
        "QwenTimestepProjEmbeddings.time_proj (scale 1000) on sigma",
        lambda: _module("transformers.transformer_qwenimage",
                        "QwenTimestepProjEmbeddings")(32).time_proj, sigma=True),
    "auraflow": Case("AuraFlowTransformer2DModel.time_step_embed: "
                     "Timesteps(256, True, 0, scale=1000) (auraflow_transformer_2d.py:335)",
                     lambda: E.Timesteps(num_channels=256, downscale_freq_shift=0,
                                         scale=1000, flip_sin_to_cos=True), sigma=True),
    "z-image": Case(
        "z-image TimestepEmbedder.timestep_embedding(t * 1000, 256)",
        lambda: (lambda t: _module("transformers.transformer_z_image", "TimestepEmbedder")
                 .timestep_embedding(t * 1000.0, 256)), sigma=True),
    "lumina2": Case(
        "Lumina2CombinedTimestepCaptionEmbedding.time_proj",
        lambda: _module("transformers.transformer_lumina2",
                        "Lumina2CombinedTimestepCaptionEmbedding")(32, 32).time_proj,
        sigma=True),
    "hidream": Case(
        "HiDreamImageTimestepEmbed.time_proj",
        lambda: _module("transformers.transformer_hidream_image",
                        "HiDreamImageTimestepEmbed")(32).time_proj),
    "sana": Case(
        "SanaCombinedTimestepGuidanceEmbeddings.time_proj",
        lambda: _module("transformers.sana_transformer",
                        "SanaCombinedTimestepGuidanceEmbeddings")(32).time_proj),
    "ltx-video": Case("AdaLayerNormSingle.emb.time_proj",
                      lambda: _module("normalization", "AdaLayerNormSingle")(32).emb.time_proj),
    "ltx2": Case("LTX2AdaLayerNormSingle.emb.time_proj",
                 lambda: _module("transformers.transformer_ltx2",
                                 "LTX2AdaLayerNormSingle")(32).emb.time_proj),
    "cogvideox": Case("CogVideoXTransformer3DModel.time_proj (inner_dim 1920)", _cogvideox),
    "cosmos": Case("CosmosEmbedding(4096).time_proj",
                   lambda: _module("transformers.transformer_cosmos",
                                   "CosmosEmbedding")(4096, 8).time_proj, sigma=True),
    "kandinsky5": Case("Kandinsky5TimeEmbeddings(2048) sinusoid", _kandinsky5),
    "kandinsky3": Case("Kandinsky3UNet.time_proj", _kandinsky3),
    "ernie-image": Case("ErnieImageTransformer2DModel.time_proj", _ernie),
    "chroma": Case("ChromaCombinedTimestepTextProjEmbeddings(t * 1000)[:, 0, :16]",
                   _chroma, sigma=True),
    "skyreels-v2": Case("SkyReelsV2Timesteps(256, True) (float64)", _float64_sinusoid,
                        fp64=True),
    "hunyuan-video-1.5": Case(
        "HunyuanVideo15TimeEmbedding.time_proj",
        lambda: _module("transformers.transformer_hunyuan_video15",
                        "HunyuanVideo15TimeEmbedding")(32, use_meanflow=True).time_proj),
    "hunyuan-dit": Case(
        "HunyuanCombinedTimestepTextSizeStyleEmbedding.time_proj",
        lambda: E.HunyuanCombinedTimestepTextSizeStyleEmbedding(
            32, pooled_projection_dim=32, seq_len=4, cross_attention_dim=32).time_proj,
        extra=(1024, 768, 0, 2048)),
    "mochi": Case("MochiCombinedTimestepCaptionEmbedding.time_proj",
                  lambda: E.MochiCombinedTimestepCaptionEmbedding(
                      32, 32, 32, time_embed_dim=256, num_attention_heads=2).time_proj),
    "allegro": Case("AdaLayerNormSingle.emb.time_proj (transformer_allegro.py)",
                    lambda: _module("normalization", "AdaLayerNormSingle")(32).emb.time_proj),
    "latte": Case("AdaLayerNormSingle.emb.time_proj (latte_transformer_3d.py)",
                  lambda: _module("normalization", "AdaLayerNormSingle")(32).emb.time_proj),
    "omnigen": Case("OmniGenTransformer2DModel.time_proj", _omnigen, sigma=True),
    "bria": Case("BriaTimesteps(256, True, 0, time_theta=10000)",
                 lambda: _module("transformers.transformer_bria", "BriaTimesteps")(
                     256, True, 0, time_theta=10000)),
    "prx": Case("get_timestep_embedding(t, 256, True, 0, scale=time_factor, "
                "max_period=time_max_period)", _prx, sigma=True),
    "ace-step": Case(
        "AceStepTimestepEmbedding.time_sinusoid(t * 1000)",
        lambda: _fn(_module("transformers.ace_step_transformer",
                            "AceStepTimestepEmbedding")(256, 8).time_sinusoid, 1000.0),
        sigma=True),
    "longcat-audio-dit": Case(
        "AudioDiTSinusPositionEmbedding(256) (scale 1000 inside)",
        lambda: _module("transformers.transformer_longcat_audio_dit",
                        "AudioDiTSinusPositionEmbedding")(256),
        sigma=True),
    "t5-film": Case("get_timestep_embedding(t * 2000, 768, max_period=2000)", _t5_film,
                    sigma=True),
    "stable-audio-3": Case(
        "StableAudio3ExpoFourierFeatures(256)",
        lambda: _module("transformers.transformer_stable_audio3",
                        "StableAudio3ExpoFourierFeatures")(256),
        sigma=True),
    "flux3": Case("Flux3Transformer2DModel.time_proj(t * 1000)", _flux3, sigma=True),
    "ideogram4": Case("Ideogram4EmbedScalar(hidden, (0, 1)): 1e4 * t, "
                      "_sinusoidal_embedding (slope first)", _ideogram4, sigma=True),
    "stable-cascade": Case("StableCascadeUNet.get_timestep_ratio_embedding "
                           "(ratio * 1e4, slope first)", _stable_cascade, sigma=True),
    "rfd4-proteina": Case("get_rfd4_time_embedding(t, t_emb_dim) (x2000, slope first)",
                          _rfd4, sigma=True),
    "cogview4": Case("CogView3CombinedTimestepSizeEmbeddings(timesteps_dim=inner_dim "
                     "of CogView4-6B).time_proj", _cogview4),
    "cogview3-plus": Case("CogView3CombinedTimestepSizeEmbeddings(timesteps_dim="
                          "inner_dim).time_proj", _cogview3_plus),
    "glm-image": Case("GlmImageCombinedTimestepSizeEmbeddings(timesteps_dim="
                      "time_embed_dim).time_proj", _glm_image),
    "nucleusmoe-image": Case("NucleusMoETimestepProjEmbeddings(inner_dim).time_proj "
                             "(scale 1000)", _nucleusmoe, sigma=True),
    "cosmos3": Case("Timesteps(256, True, 0)(t * timestep_scale)", _cosmos3),
    "krea2": Case("Krea2TimestepEmbedding: (t * 1e3) * freqs, cos|sin", _krea2,
                  sigma=True),
    "qwen-image-2.1": Case("QwenImage21TemporalTimesteps(256) (1000 * t)",
                           _qwen_image_21, sigma=True),
    "bria-fibo2": Case("TimestepEmbedder.timestep_embedding(t * t_scale, 256)",
                       _bria_fibo2, sigma=True),
}

# Presets the lead's own tests cover (their frequency tables come from a
# checkpoint, not from diffusers' code).
NOT_HERE = {"stable-audio-open"}


@pytest.fixture(scope="module")
def references():
    built = {}

    def get(name):
        if name not in built:
            with torch.no_grad():
                built[name] = CASES[name].reference()
        return built[name]
    return get


def _timesteps(case):
    """(every t to check in fp32, the family's natural range for casts)."""
    steps = np.concatenate([STEPS, RANDOM_STEPS, np.float32(case.extra)])
    if not case.sigma:
        return steps, steps
    sigmas = np.concatenate([SIGMAS, RANDOM_SIGMAS])
    return np.concatenate([steps, sigmas]), sigmas


def _max_angles(spec, t):
    """The largest angle of each row: |scale * time_factor * t| * f_max."""
    f_max = max(spec.frequencies) if spec.frequencies else 1.0
    return (abs(spec.scale or 1.0) * np.abs((spec.time_factor or 1.0) * t.astype(np.float64))
            * f_max)


def _ulp(values, dtype):
    return np.spacing(np.maximum(values, 1.0).astype(dtype)).astype(np.float64)


def test_every_preset_has_a_case(info):
    missing = {p.name for p in info.presets} - set(CASES) - NOT_HERE
    assert not missing, f"presets without a diffusers parity case: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_preset_matches_diffusers(client, info, references, measure, name):
    case = CASES[name]
    preset = info.preset(name)
    if preset is None:
        pytest.fail(f"the server has no preset {name!r}")
    reference = references(name)
    t, natural = _timesteps(case)
    with torch.no_grad():
        want = reference(torch.from_numpy(t))
    dim = case.dim
    assert want.shape == (t.size, dim or preset.spec.dim), case.source

    # Full precision: fp32 (fp64 for the float64 families), per-row bound.
    wide = "fp64" if case.fp64 else "fp32"
    got = client.embed(t, preset=name, dim=dim, dtype=wide, return_tensors="pt")
    error = (got.double() - want.double()).abs().numpy()
    ulp = _ulp(_max_angles(preset.spec, t), np.float64 if case.fp64 else np.float32)
    in_ulps = error / ulp[:, None]
    worst = np.unravel_index(np.argmax(in_ulps), in_ulps.shape)
    bound = FP64_ULPS if case.fp64 else case.ulps
    measure(f"max |{wide} - diffusers|",
            f"{in_ulps.max():.3g} ulp of the angle (bound {bound:g}; "
            f"{error[worst]:.3g} at t={t[worst[0]]:g}, column {worst[1]}); "
            f"largest difference {error.max():.3g}")
    assert in_ulps.max() <= bound, (
        f"{name} vs {case.source}: {in_ulps.max():.3g} ulp of the angle at "
        f"t={t[worst[0]]}, column {worst[1]} ({error[worst]:.3g})")

    # bf16, fp16 (and fp32 for the float64 families): the same rounding of
    # the same numbers, over the natural range.
    with torch.no_grad():
        want = reference(torch.from_numpy(natural))
    dtypes = [torch.bfloat16, torch.float16] + ([torch.float32] if case.fp64 else [])
    fractions = []
    for dtype in dtypes:
        got = client.embed(natural, preset=name, dim=dim, dtype=dtype,
                           return_tensors="pt")
        assert got.dtype == dtype
        fraction = (got == want.to(dtype)).double().mean().item()
        dtype_name = str(dtype)[len("torch."):]
        floor = EQUAL_FLOORS.get(name, {}).get(dtype_name, MIN_EQUAL_FRACTION)
        fractions.append(f"{dtype_name} {fraction:.5f}")
        assert fraction >= floor, (
            f"{name}: {dtype_name} equals diffusers' cast in {fraction:.4%} of "
            f"elements (floor {floor:.3%})")
    measure("equal after the cast (natural range)", ", ".join(fractions))


# --- pipelines in bf16/fp16: timestep_dtype ----------------------------------

# (preset, dtype the pipeline holds t in, what diffusers' model does to t)
PIPELINE_DTYPES = [
    ("flux", torch.bfloat16, "timestep.to(hidden_states.dtype) * 1000"),
    ("flux2", torch.bfloat16, "timestep.to(hidden_states.dtype) * 1000"),
    ("chroma", torch.bfloat16, "timestep.to(hidden_states.dtype) * 1000"),
    ("ace-step", torch.bfloat16, "t * 1000.0 in t's dtype"),
    ("longcat-audio-dit", torch.bfloat16, "1000 * t.to(hidden dtype)"),
    ("qwen-image", torch.bfloat16, "sigma.to(latents.dtype)"),
    ("auraflow", torch.float16, "t / 1000 .to(latents.dtype) (fp16)"),
    ("hunyuan-video-1.5", torch.bfloat16, "t.to(latent dtype)"),
    ("ernie-image", torch.bfloat16, "torch.full(..., dtype=transformer.dtype)"),
    ("flux3", torch.bfloat16, "timestep.to(dtype) * 1000"),
    ("stable-cascade", torch.bfloat16, "timestep_ratio.to(dtype) * 10000"),
]


@pytest.mark.parametrize("name, dtype, what", PIPELINE_DTYPES,
                         ids=[p[0] for p in PIPELINE_DTYPES])
def test_timestep_dtype_matches_the_pipeline(client, info, references, measure,
                                             name, dtype, what):
    case = CASES[name]
    preset = info.preset(name)
    t = _timesteps(case)[1]
    factor = preset.spec.time_factor or 1.0
    # What the model feeds its sinusoid: t rounded to dtype, times the
    # factor in dtype, widened exactly; the module then runs in float32.
    # A time_factor case's reference multiplies by the factor itself, so it
    # gets the product divided back (exactly: the product is a float32).
    in_dtype = (torch.from_numpy(t).to(dtype) * factor).float()
    module_input = in_dtype / factor
    assert torch.equal(module_input * factor, in_dtype)
    with torch.no_grad():
        want = references(name)(module_input)
    got = client.embed(t, preset=name, timestep_dtype=dtype, return_tensors="pt")
    ulp = _ulp(_max_angles(preset.spec, module_input.numpy()), np.float32)
    in_ulps = ((got.double() - want.double()).abs().numpy() / ulp[:, None]).max()
    cast = client.embed(t, preset=name, timestep_dtype=dtype, dtype=dtype,
                        return_tensors="pt")
    fraction = (cast == want.to(dtype)).double().mean().item()
    measure(f"timestep_dtype={str(dtype)[6:]} vs {what}",
            f"{in_ulps:.3g} ulp; cast equal {fraction:.5f}")
    assert in_ulps <= case.ulps
    floor = EQUAL_FLOORS.get(name, {}).get(str(dtype)[6:], MIN_EQUAL_FRACTION)
    assert fraction >= floor
    # And it differs from sending t unrounded wherever rounding moves t.
    if name in ("flux", "ace-step"):
        plain = client.embed(t, preset=name, return_tensors="pt")
        assert not torch.equal(plain, got)


# --- shapes and parts ----------------------------------------------------------

def test_per_token_timesteps_2x7_give_2x7xD(client, references):
    # LTX-Video / Wan 2.2 TI2V: per-token timesteps [B, L]; diffusers
    # flattens them and reshapes the result.
    t = torch.from_numpy(RANDOM_STEPS[:14].reshape(2, 7))
    got = client.embed(t, preset="ltx-video", return_tensors="pt")
    assert got.shape == (2, 7, 256)
    with torch.no_grad():
        want = references("ltx-video")(t.flatten()).reshape(2, 7, 256)
    bound = ULPS * _ulp(np.float64(t.abs().max()), np.float32)
    assert (got - want).abs().max().item() <= bound
    np_got = client.embed(t.numpy(), preset="ltx-video", dtype="bf16",
                          return_tensors="pt")
    assert np_got.shape == (2, 7, 256) and np_got.dtype == torch.bfloat16


def test_cosmos_video_timesteps_b1t11(client, references):
    t = torch.from_numpy(RANDOM_SIGMAS[:6].reshape(2, 1, 3, 1, 1))
    got = client.embed(t, preset="cosmos", return_tensors="pt")
    assert got.shape == (2, 1, 3, 1, 1, 4096)
    with torch.no_grad():
        want = references("cosmos")(t.flatten()).reshape(got.shape)
    assert (got - want).abs().max().item() <= ULPS * 2.0 ** -23


def test_flux_timestep_and_guidance_in_one_call(client, references, measure):
    # FluxTransformer2DModel.forward: timestep.to(dtype) * 1000 and
    # guidance.to(dtype) * 1000, both through the one time_proj.
    sigma = torch.from_numpy(np.concatenate([SIGMAS, RANDOM_SIGMAS[:4]]))
    guidance = torch.full_like(sigma, 3.5)
    got = client.embed_parts({"timestep": sigma, "guidance": guidance},
                             preset="flux", timestep_dtype="bf16",
                             return_tensors="pt")
    assert list(got) == ["timestep", "guidance"]
    time_proj = E.CombinedTimestepGuidanceTextProjEmbeddings(32, 32).time_proj
    for name, values in (("timestep", sigma), ("guidance", guidance)):
        with torch.no_grad():
            want = time_proj((values.to(torch.bfloat16) * 1000).float())
        assert got[name].shape == (sigma.numel(), 256)
        bound = ULPS * _ulp(np.float64(want.new_tensor(1000.0 * 3.5)), np.float32)
        error = (got[name] - want).abs().max().item()
        measure(f"flux {name} part", f"max error {error:.3g}")
        assert error <= bound
    cast = client.embed_parts({"timestep": sigma, "guidance": guidance},
                              preset="flux", timestep_dtype="bf16",
                              dtype="bf16", return_tensors="pt")
    assert all(tensor.dtype == torch.bfloat16 for tensor in cast.values())


# part -> the diffusers module that computes it
PART_MODULES = {
    ("sdxl", "time"): ("sdxl", lambda: _unet_time_proj()),
    ("sdxl", "add_time"): ("sdxl-add-time", lambda: _unet_add_time_proj()),
    ("pixart", "resolution"): ("pixart", lambda: E.PixArtAlphaCombinedTimestepSizeEmbeddings(
        48, 16, True).additional_condition_proj),
    ("pixart", "aspect_ratio"): ("pixart", lambda: E.PixArtAlphaCombinedTimestepSizeEmbeddings(
        48, 16, True).additional_condition_proj),
    ("sana", "guidance"): ("sana", lambda: _module(
        "transformers.sana_transformer",
        "SanaCombinedTimestepGuidanceEmbeddings")(32).guidance_condition_proj),
    ("hunyuan-dit", "image_meta_size"): ("hunyuan-dit", lambda: E.HunyuanCombinedTimestepTextSizeStyleEmbedding(
        32, pooled_projection_dim=32, seq_len=4, cross_attention_dim=32).size_proj),
    ("hunyuan-video-1.5", "r"): ("hunyuan-video-1.5", lambda: _module(
        "transformers.transformer_hunyuan_video15",
        "HunyuanVideo15TimeEmbedding")(32, use_meanflow=True).time_proj_r),
    ("chroma", "guidance"): ("chroma", lambda: _module(
        "transformers.transformer_chroma",
        "ChromaCombinedTimestepTextProjEmbeddings")(16, 344).guidance_proj),
}


def test_multi_part_presets(client, info, references):
    """Every preset with parts: one call, each part equal (within the
    preset's bound) to the diffusers module that computes it."""
    checked = 0
    for preset in info.presets:
        if not preset.parts:
            continue
        values = {name: np.float32([[1024.0, 768.0, 0.0]]) if "size" in name
                  or "add_time" in name or "resolution" in name
                  else np.float32([0.0, 1.0, 0.5]) for name, _ in preset.parts}
        got = client.embed_parts(values, preset=preset.name, return_tensors="pt")
        assert list(got) == [name for name, _ in preset.parts]
        for name, part_preset in preset.parts:
            spec = info.preset(part_preset).spec
            t = values[name].reshape(-1)
            entry = PART_MODULES.get((preset.name, name))
            with torch.no_grad():
                if entry is None or spec.time_factor not in (None, 1.0):
                    want = references(part_preset)(torch.from_numpy(t))
                else:
                    want = entry[1]()(torch.from_numpy(t))
            want = want.reshape(got[name].shape)
            ulp = _ulp(_max_angles(spec, t).max(), np.float32)
            assert (got[name] - want).abs().max().item() <= ULPS * ulp, (
                preset.name, name)
            checked += 1
    assert checked >= 20


# --- a denoising step's embeddings in one call -------------------------------

def _step_bound(t):
    """ULPS ulp of the largest angle: a frequency exp may round differently."""
    return ULPS * float(np.spacing(np.float32(max(1.0, float(np.abs(t).max())))))


def test_cogview4_step_in_one_call(client):
    """CogView4's timestep and its six size scalars, one call, against
    CogView3CombinedTimestepSizeEmbeddings' own projections."""
    module = _cogview_embeddings(
        ("transformers.transformer_cogview4", "CogView4Transformer2DModel"),
        COGVIEW4_6B_INNER_DIM)
    t = torch.tensor([999.0, 421.0])
    sizes = {"original_size": torch.tensor([[1024.0, 1024.0], [768.0, 1360.0]]),
             "crop_coords": torch.tensor([[0.0, 0.0], [16.0, 32.0]]),
             "target_size": torch.tensor([[1024.0, 1024.0], [768.0, 1360.0]])}
    got = client.embed_parts({"timestep": t, **sizes}, preset="cogview4",
                             return_tensors="pt")
    with torch.no_grad():
        want = {"timestep": module.time_proj(t)}
        for name, value in sizes.items():  # the model's flatten + view
            want[name] = module.condition_proj(value.flatten()).view(2, -1)
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_allclose(
            got[name].reshape(2, -1).numpy(), value.numpy(), rtol=0,
            atol=_step_bound(t.numpy() if name == "timestep" else 1360.0),
            err_msg=name)


def test_stable_cascade_step_in_one_call(client):
    """Stable Cascade's ratio, sca and crp embeddings, one call, against the
    concatenation StableCascadeUNet.forward builds."""
    ratio_embedding = _stable_cascade()
    r = torch.tensor([0.9, 0.25])
    sca = torch.tensor([0.5, 0.0])
    crp = torch.tensor([0.0, 0.75])
    got = client.embed_parts({"timestep_ratio": r, "sca": sca, "crp": crp},
                             preset="stable-cascade", return_tensors="pt")
    with torch.no_grad():
        want = torch.cat([ratio_embedding(r), ratio_embedding(sca),
                          ratio_embedding(crp)], dim=1)
    joined = torch.cat([got["timestep_ratio"], got["sca"], got["crp"]], dim=1)
    np.testing.assert_allclose(joined.numpy(), want.numpy(), rtol=0,
                               atol=_step_bound(np.float32([1e4 * 0.9])))
