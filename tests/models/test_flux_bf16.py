"""A bf16 Flux transformer whose timestep embeddings temb serves equals the
unpatched model bit for bit: on the embedding path (time_text_embed) and
on the whole model output.

A tiny random-weight diffusers.FluxTransformer2DModel (guidance_embeds), in
bfloat16, run the way FluxPipeline runs it: latents and prompt embeddings
in bf16, timestep = sigma in bf16 (``t.expand(B).to(latents.dtype) / 1000``),
guidance in float32.  The model itself computes
``timestep.to(bf16) * 1000`` and ``guidance.to(bf16) * 1000``, feeds both to
one ``time_proj = Timesteps(256, True, 0)`` and casts its float32 output to
bf16 before the MLPs.

Two ways of serving the embeddings, both against the unpatched model:
  * temb.torch.patch: the time_proj module is swapped for temb's (the
    registered custom op); it receives what the model computed.
  * one embed_parts call from the pipeline's own values: preset "flux"
    with timestep_dtype=bf16, so the server does the bf16 rounding and the
    x1000 in bf16 itself; the model's time_proj is replaced by a stub that
    checks it is asked for exactly those values and returns the served
    embeddings.
"""

import copy

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import temb.torch as temb_torch  # noqa: E402

BATCH, IMAGE_TOKENS, TEXT_TOKENS = 2, 16, 8


@pytest.fixture(scope="module")
def flux():
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
        pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(4, 6, 6))
    return model.to(torch.bfloat16).eval()


@pytest.fixture(scope="module")
def inputs():
    generator = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(torch.bfloat16)
    img_ids = torch.stack(torch.meshgrid(
        torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij"),
        dim=-1).reshape(-1, 3)
    sigmas = torch.tensor([0.7531, 0.0625])  # a late and an early step
    return dict(
        hidden_states=randn(BATCH, IMAGE_TOKENS, 4),
        encoder_hidden_states=randn(BATCH, TEXT_TOKENS, 32),
        pooled_projections=randn(BATCH, 32),
        # FluxPipeline: timestep = t.expand(B).to(latents.dtype), then / 1000
        timestep=(sigmas * 1000).to(torch.bfloat16) / 1000,
        img_ids=img_ids, txt_ids=torch.zeros(TEXT_TOKENS, 3),
        guidance=torch.full([BATCH], 3.5, dtype=torch.float32),
        return_dict=False)


def _embedding_path(model, inputs):
    """time_text_embed's output, called as FluxTransformer2DModel.forward
    calls it."""
    dtype = inputs["hidden_states"].dtype
    return model.time_text_embed(inputs["timestep"].to(dtype) * 1000,
                                 inputs["guidance"].to(dtype) * 1000,
                                 inputs["pooled_projections"])


def test_patched_bf16_flux_is_bitwise_the_unpatched_one(flux, inputs, client):
    patched = copy.deepcopy(flux)
    assert temb_torch.patch(patched, client=client) == ["time_text_embed.time_proj"]
    with torch.no_grad():
        want_embedding = _embedding_path(flux, inputs)
        got_embedding = _embedding_path(patched, inputs)
        want = flux(**inputs)[0]
        got = patched(**inputs)[0]
    assert got_embedding.dtype == torch.bfloat16
    assert torch.equal(got_embedding, want_embedding)
    assert got.dtype == torch.bfloat16 and got.shape == (BATCH, IMAGE_TOKENS, 4)
    assert torch.equal(got, want)


class _Served(torch.nn.Module):
    """Stands in for time_proj: returns the embeddings temb served, in call
    order, after checking the model asks for the t temb embedded."""

    def __init__(self, expected, embeddings):
        super().__init__()
        self.calls = list(zip(expected, embeddings))

    def forward(self, t):
        expected, embedding = self.calls.pop(0)
        assert torch.equal(t.float(), expected), (t, expected)
        return embedding


def test_flux_served_from_the_pipeline_values_in_one_call(flux, inputs, client):
    served = client.embed_parts(
        {"timestep": inputs["timestep"], "guidance": inputs["guidance"]},
        preset="flux", timestep_dtype="bf16", return_tensors="pt")
    assert [tuple(e.shape) for e in served.values()] == [(BATCH, 256)] * 2
    # What the model computes from those values and embeds.
    model_t = (inputs["timestep"].to(torch.bfloat16) * 1000).float()
    model_g = (inputs["guidance"].to(torch.bfloat16) * 1000).float()
    assert model_g.tolist() == [3504.0] * BATCH  # 3.5 * 1000 rounded to bf16
    swapped = copy.deepcopy(flux)
    with torch.no_grad():
        swapped.time_text_embed.time_proj = _Served(
            [model_t, model_g], [served["timestep"], served["guidance"]])
        got_embedding = _embedding_path(swapped, inputs)
        want_embedding = _embedding_path(flux, inputs)
        swapped.time_text_embed.time_proj = _Served(
            [model_t, model_g], [served["timestep"], served["guidance"]])
        got = swapped(**inputs)[0]
        want = flux(**inputs)[0]
    assert torch.equal(got_embedding, want_embedding)
    assert torch.equal(got, want)
    # Without timestep_dtype the server would embed 3500, not 3504.
    plain = client.embed(inputs["guidance"], preset="flux", return_tensors="pt")
    assert not torch.equal(plain, served["guidance"])
