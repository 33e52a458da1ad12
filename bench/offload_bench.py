#!/usr/bin/env python3
"""What temb.torch.offload_conditioning frees and what a step costs.

  offload_bench.py table
      Not available now: it counted, for each family at its released
      config on the meta device, the parameters offload_conditioning
      releases, and those are now named by a served model's description,
      which needs a checkpoint (docs/offload.md keeps the last table).

  offload_bench.py slice --server BIN [--steps 5] [--image_tokens 64]
      A real-width slice of Qwen-Image (D = 3072, 4 of its 60 blocks,
      random bf16 weights): parameter bytes and this process's RSS before
      and after the patch, and the median time of one transformer step
      unpatched, patched with the server computing every step (its row
      cache off), and patched with the client's cache warm.  The server
      (temb-server BIN, started here on 127.0.0.1) serves the slice's
      conditioning tensors from a temporary model repository.

Run with the project's Python (torch, diffusers, tritonclient), from the
repository root.  The client is temb.Client when it has condition(), else
KServe v2 gRPC through tritonclient (tests/pylib/temb_kserve_conditioning.py).
"""

import argparse
import contextlib
import ctypes
import gc
import json
import pathlib
import statistics
import sys
import tempfile
import time

import torch
import diffusers

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "pylib"))
from temb_client_suite import use_client_from_source  # noqa: E402

use_client_from_source()
import temb  # noqa: E402
import temb.torch  # noqa: E402

# Released configs (diffusers 0.42.1 class defaults or the released
# config.json; see the maintainers' guide, conditioning.md section 1).
RELEASED = {
    "Qwen-Image": (diffusers.QwenImageTransformer2DModel, dict(
        patch_size=2, in_channels=64, out_channels=16, num_layers=60,
        attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=3584, axes_dims_rope=(16, 56, 56))),
    # Qwen-Image's widths and depth with the layered model's flags: one
    # nn.Embedding(2, D) more in time_text_embed.
    "Qwen-Image-Layered": (diffusers.QwenImageTransformer2DModel, dict(
        patch_size=2, in_channels=64, out_channels=16, num_layers=60,
        attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=3584, axes_dims_rope=(16, 56, 56),
        use_additional_t_cond=True, use_layer3d_rope=True)),
    "FLUX.1-dev": (diffusers.FluxTransformer2DModel, dict(
        patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
        attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=4096, pooled_projection_dim=768,
        guidance_embeds=True, axes_dims_rope=(16, 56, 56))),
    "FLUX.1-schnell": (diffusers.FluxTransformer2DModel, dict(
        patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
        attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=4096, pooled_projection_dim=768,
        guidance_embeds=False, axes_dims_rope=(16, 56, 56))),
    "SD3-medium": (diffusers.SD3Transformer2DModel, dict(
        sample_size=128, patch_size=2, in_channels=16, num_layers=24,
        attention_head_dim=64, num_attention_heads=24,
        joint_attention_dim=4096, caption_projection_dim=1536,
        pooled_projection_dim=2048, out_channels=16,
        pos_embed_max_size=192)),
    "SD3.5-medium": (diffusers.SD3Transformer2DModel, dict(
        sample_size=128, patch_size=2, in_channels=16, num_layers=24,
        attention_head_dim=64, num_attention_heads=24,
        joint_attention_dim=4096, caption_projection_dim=1536,
        pooled_projection_dim=2048, out_channels=16,
        pos_embed_max_size=384, qk_norm="rms_norm",
        dual_attention_layers=tuple(range(13)))),
    "SD3.5-large": (diffusers.SD3Transformer2DModel, dict(
        sample_size=128, patch_size=2, in_channels=16, num_layers=38,
        attention_head_dim=64, num_attention_heads=38,
        joint_attention_dim=4096, caption_projection_dim=2432,
        pooled_projection_dim=2048, out_channels=16,
        pos_embed_max_size=192, qk_norm="rms_norm")),
    # FLUX.2-dev: the class defaults; klein: the released config.json.
    "FLUX.2-dev": (diffusers.Flux2Transformer2DModel, dict(
        patch_size=1, in_channels=128, num_layers=8, num_single_layers=48,
        attention_head_dim=128, num_attention_heads=48,
        joint_attention_dim=15360, guidance_embeds=True)),
    "FLUX.2-klein-4B": (diffusers.Flux2Transformer2DModel, dict(
        patch_size=1, in_channels=128, num_layers=5, num_single_layers=20,
        attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=7680, guidance_embeds=False)),
    "FLUX.2-klein-9B": (diffusers.Flux2Transformer2DModel, dict(
        patch_size=1, in_channels=128, num_layers=8, num_single_layers=24,
        attention_head_dim=128, num_attention_heads=32,
        joint_attention_dim=12288, guidance_embeds=False)),
    # HunyuanVideo-1.5 480p/720p: the class defaults.
    "HunyuanVideo-1.5": (diffusers.HunyuanVideo15Transformer3DModel, dict(
        in_channels=65, out_channels=32, num_attention_heads=16,
        attention_head_dim=128, num_layers=54, num_refiner_layers=2,
        text_embed_dim=3584, text_embed_2_dim=1472, image_embed_dim=1152)),
    # Its super-resolution model: the same blocks with MeanFlow's second
    # timestep embedder (the guide's count; in_channels as the main model's).
    "HunyuanVideo-1.5-SR": (diffusers.HunyuanVideo15Transformer3DModel, dict(
        in_channels=65, out_channels=32, num_attention_heads=16,
        attention_head_dim=128, num_layers=54, num_refiner_layers=2,
        text_embed_dim=3584, text_embed_2_dim=1472, image_embed_dim=1152,
        use_meanflow=True)),
    # SDXL base 1.0's unet/config.json.
    "SDXL base UNet": (diffusers.UNet2DConditionModel, dict(
        sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D",
                          "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                        "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10),
        attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
        use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816)),
    # The table and video families (the guide's section 1 configs).
    "Wan2.1-T2V-14B": (diffusers.WanTransformer3DModel, dict(
        patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128,
        in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
        ffn_dim=13824, num_layers=40, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6)),
    "Wan2.2-TI2V-5B": (diffusers.WanTransformer3DModel, dict(
        patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128,
        in_channels=48, out_channels=48, text_dim=4096, freq_dim=256,
        ffn_dim=14336, num_layers=30, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6)),
    "CogVideoX-5B": (diffusers.CogVideoXTransformer3DModel, dict(
        num_attention_heads=48, attention_head_dim=64, in_channels=16,
        out_channels=16, time_embed_dim=512, text_embed_dim=4096,
        num_layers=42, sample_width=90, sample_height=60, sample_frames=49,
        patch_size=2, max_text_seq_length=226,
        use_rotary_positional_embeddings=True,
        use_learned_positional_embeddings=False)),
    "PixArt-Sigma-XL-1024": (diffusers.PixArtTransformer2DModel, dict(
        num_attention_heads=16, attention_head_dim=72, in_channels=4,
        out_channels=8, num_layers=28, cross_attention_dim=1152,
        caption_channels=4096, sample_size=128, patch_size=2,
        norm_type="ada_norm_single", interpolation_scale=2,
        use_additional_conditions=False)),
    # HunyuanVideo (1.0, 13B): the class defaults.
    "HunyuanVideo": (diffusers.HunyuanVideoTransformer3DModel, dict(
        num_attention_heads=24, attention_head_dim=128)),
    # HiDream-I1 (Full, Dev and Fast share the transformer's shape): its
    # llama_layers lists one llama3 layer per block.
    "HiDream-I1": (diffusers.HiDreamImageTransformer2DModel, dict(
        patch_size=2, in_channels=16, num_layers=16, num_single_layers=32,
        attention_head_dim=128, num_attention_heads=20,
        caption_channels=[4096, 4096], text_emb_dim=2048,
        num_routed_experts=4, num_activated_experts=2,
        axes_dims_rope=(64, 32, 32), max_resolution=(128, 128),
        llama_layers=list(range(48)))),
    # Chroma1: the class defaults (FLUX.1's blocks, the 5120-wide
    # approximator of 5 layers).
    "Chroma1": (diffusers.ChromaTransformer2DModel, dict(
        num_attention_heads=24, attention_head_dim=128)),
    # Lumina-Image-2.0: its released transformer config (Gemma-2-2B text).
    "Lumina-Image-2.0": (diffusers.Lumina2Transformer2DModel, dict(
        sample_size=128, patch_size=2, in_channels=16, hidden_size=2304,
        num_layers=26, num_refiner_layers=2, num_attention_heads=24,
        num_kv_heads=8, multiple_of=256, axes_dim_rope=(32, 32, 32),
        axes_lens=(300, 512, 512), cap_feat_dim=2304)),
    # Z-Image(-Turbo): the class defaults.
    "Z-Image": (diffusers.ZImageTransformer2DModel, dict(dim=3840)),
    # Sana 1600M and 600M (1024 px), their released transformer configs.
    "Sana-1600M": (diffusers.SanaTransformer2DModel, dict(
        num_attention_heads=70, attention_head_dim=32, num_layers=20,
        num_cross_attention_heads=20, cross_attention_head_dim=112,
        cross_attention_dim=2240, caption_channels=2304, sample_size=32)),
    # Sana-Sprint 1600M: Sana-1600M's shape with the guidance embedder and
    # RMS norms across the query and key heads.
    "Sana-Sprint-1600M": (diffusers.SanaTransformer2DModel, dict(
        num_attention_heads=70, attention_head_dim=32, num_layers=20,
        num_cross_attention_heads=20, cross_attention_head_dim=112,
        cross_attention_dim=2240, caption_channels=2304, sample_size=32,
        guidance_embeds=True, qk_norm="rms_norm_across_heads")),
    "Sana-600M": (diffusers.SanaTransformer2DModel, dict(
        num_attention_heads=36, attention_head_dim=32, num_layers=28,
        num_cross_attention_heads=16, cross_attention_head_dim=72,
        cross_attention_dim=1152, caption_channels=2304, sample_size=32)),
    # LTX-Video 2B (0.9.x) is the class defaults; 13B (0.9.7) D = 4096.
    "LTX-Video-2B": (diffusers.LTXVideoTransformer3DModel, dict(
        num_attention_heads=32, attention_head_dim=64, num_layers=28,
        cross_attention_dim=2048)),
    "LTX-Video-13B": (diffusers.LTXVideoTransformer3DModel, dict(
        num_attention_heads=32, attention_head_dim=128, num_layers=48,
        cross_attention_dim=4096)),
}

GIB = float(1 << 30)


def table(_args):
    # conditioning_modules() now reads the modules from a served model's
    # description, which a server gives only for a loaded checkpoint; a
    # released config on the meta device has none.  The table in
    # docs/offload.md was counted before that change.
    sys.exit("offload_bench.py table: not available: the replaced modules "
             "come from a served model's description now, and a meta-device "
             "config has no checkpoint to serve (see docs/offload.md)")


def rss_bytes():
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def trim():
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def parameter_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def make_client(target, name):
    if hasattr(temb.Client, "condition"):
        return temb.Client(target), "temb.Client (native API)"
    from temb_kserve_conditioning import KServeConditioning
    return KServeConditioning(target, [name]), "KServe v2 gRPC (tritonclient)"


def slice_(args):
    from temb_testing import TembServer
    torch.manual_seed(0)
    with torch.device("cpu"):
        torch.set_default_dtype(torch.bfloat16)
        model = diffusers.QwenImageTransformer2DModel(
            **{**RELEASED["Qwen-Image"][1], "num_layers": 4}).eval()
        torch.set_default_dtype(torch.float32)
    # Random weights of a realistic scale (the default init is fine).
    # Which modules the patch replaces is the served model's description,
    # known once the server has loaded it; the checkpoint it loads holds
    # Qwen-Image's conditioning tensors, picked here by their names.
    conditioning_keys = ("time_text_embed.", ".img_mod.", ".txt_mod.",
                         "norm_out.linear.")

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="offload-bench-"))
    folder = workdir / "repository" / "qwen-image-slice"
    folder.mkdir(parents=True)
    # The server reads the conditioning tensors only, so the folder holds
    # just those (and config.json): 0.9 GiB instead of the slice's 2.7.
    from safetensors.torch import save_file
    state = {key: value for key, value in model.state_dict().items()
             if any(part in key for part in conditioning_keys)}
    cond_bytes = sum(v.numel() * v.element_size() for v in state.values())
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))
    model.save_config(folder)
    # Nothing here may keep the replaced modules alive.
    del state

    server = TembServer(args.server, workdir, "--backend=cpu",
                        f"--model_repository={workdir / 'repository'}",
                        "--conditioning_cache_bytes=0")
    client, client_name = make_client(server.target, "qwen-image-slice")
    for _ in range(600):
        try:
            client.condition("qwen-image-slice", [1.0], outputs=["temb"])
            break
        except Exception:  # still loading
            time.sleep(0.2)

    generator = torch.Generator().manual_seed(1)
    img_side = int(round(args.image_tokens ** 0.5))
    hidden = torch.randn(1, img_side * img_side, 64,
                         generator=generator).to(torch.bfloat16)
    text = torch.randn(1, args.text_tokens, 3584,
                       generator=generator).to(torch.bfloat16)
    call = dict(hidden_states=hidden, encoder_hidden_states=text,
                encoder_hidden_states_mask=torch.ones(1, args.text_tokens),
                img_shapes=[[(1, img_side, img_side)]], return_dict=False)
    # Distinct timesteps per run, so that only the warm run hits a cache.
    schedules = [torch.linspace(1000 - r, 100 + r, args.steps)
                 for r in range(3)]

    def run(schedule):
        times = []
        with torch.no_grad():
            for t in schedule:
                start = time.perf_counter()
                model(timestep=(t.expand(1).to(torch.bfloat16) / 1000), **call)
                times.append(time.perf_counter() - start)
        return statistics.median(times), times

    torch.set_num_threads(args.threads)
    run(schedules[0][:1])  # warm-up: allocations, kernels
    unpatched = run(schedules[0])

    # The parts alone, steadier than differences of whole steps on a busy
    # machine: the conditioning modules' work for one row, in process...
    served = next(m for m in client.models() if m.name == "qwen-image-slice")
    modules = temb.torch.conditioning_modules(model, served)
    linears = [m for name, m in modules.items() if name != "time_text_embed"]
    own = []
    with torch.no_grad():
        for t in schedules[0]:
            start = time.perf_counter()
            temb_row = model.time_text_embed(
                t.expand(1).to(torch.bfloat16) / 1000, hidden)
            silu = torch.nn.functional.silu(temb_row)
            for linear in linears:
                linear(silu)
            own.append(time.perf_counter() - start)
    del modules, linears, linear  # the loop variable holds one too
    # ...and one call for one row (the server's cache is off).
    calls_s = []
    for t in schedules[2]:
        start = time.perf_counter()
        client.condition("qwen-image-slice", t.reshape(1),
                         return_tensors="pt")
        calls_s.append(time.perf_counter() - start)

    trim()
    params_before, rss_before = parameter_bytes(model), rss_bytes()
    offload = temb.torch.offload_conditioning(model, client=client,
                                              model="qwen-image-slice")
    trim()
    params_after, rss_after = parameter_bytes(model), rss_bytes()

    calls = offload.calls
    cold = run(schedules[1])
    cold_calls = offload.calls - calls
    warm = run(schedules[1])
    warm_calls = offload.calls - calls - cold_calls
    server.stop()

    report = {
        "client": client_name,
        "threads": args.threads,
        "image_tokens": img_side * img_side,
        "text_tokens": args.text_tokens,
        "conditioning_bytes": cond_bytes,
        "freed_bytes": offload.freed_bytes,
        "parameter_bytes_before": params_before,
        "parameter_bytes_after": params_after,
        "rss_before": rss_before,
        "rss_after": rss_after,
        "step_s_unpatched": unpatched[0],
        "step_s_patched_server": cold[0],
        "step_s_patched_cache_warm": warm[0],
        "conditioning_s_in_process": statistics.median(own),
        "call_s_one_row": statistics.median(calls_s),
        "calls_server_run": cold_calls,
        "calls_warm_run": warm_calls,
        "steps": args.steps,
        "all_steps_s": {"unpatched": unpatched[1], "server": cold[1],
                        "warm": warm[1]},
    }
    print(json.dumps(report, indent=1))
    print(f"parameters: {params_before / GIB:.3f} -> {params_after / GIB:.3f} "
          f"GiB (freed {(params_before - params_after) / GIB:.3f}, "
          f"conditioning {cond_bytes / GIB:.3f})")
    print(f"RSS: {rss_before / GIB:.3f} -> {rss_after / GIB:.3f} GiB "
          f"(down {(rss_before - rss_after) / GIB:.3f})")
    print(f"conditioning alone, median: in process {statistics.median(own):.3f}"
          f" s, one call {statistics.median(calls_s):.3f} s")
    print(f"step, median of {args.steps}: unpatched {unpatched[0]:.3f} s, "
          f"patched (server) {cold[0]:.3f} s, patched (cache warm) "
          f"{warm[0]:.3f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("table")
    p = sub.add_parser("slice")
    p.add_argument("--server", required=True, help="temb-server binary")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--image_tokens", type=int, default=64)
    p.add_argument("--text_tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    {"table": table, "slice": slice_}[args.command](args)


if __name__ == "__main__":
    main()
