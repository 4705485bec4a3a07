"""Hugging Face transformers and diffusers models on "tpu", against the CPU.

Models none of the project's examples were written for: each is built from a
small config with random weights (nothing is downloaded), its dropouts set to
0 and its random training-time masking off, and run in train mode for one
forward and backward, eager and compiled (`torch.compile(backend="tpu")`,
every graph one program). Loss and every parameter gradient are compared with
the CPU's. Greedy `generate()` must pick the CPU's tokens, eager and with a
compiled forward over a static cache.
"""
import contextlib
import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import diffusers as D  # noqa: E402
import transformers as T  # noqa: E402
import torch_pjrt  # noqa: E402
from util import all_graphs_lowered  # noqa: E402

T.logging.set_verbosity_error()
D.utils.logging.set_verbosity_error()


def _dec(cls, cfg, **kw):
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                vocab_size=256, max_position_embeddings=128)
    base.update(kw)
    return lambda: cls(cfg(**base))


_ENC_DEC = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256)
_VIS = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)

# name -> (builder, input kind); each chosen for a feature the others lack.
MODELS = {
    # Conv1D projections, learned positions
    "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256,
                                                      n_positions=128)), "text"),
    # encoder, padding mask, token types, masked-LM head
    "bert": (_dec(T.BertForMaskedLM, T.BertConfig), "text"),
    # disentangled relative attention
    "deberta_v2": (_dec(T.DebertaV2ForMaskedLM, T.DebertaV2Config), "text"),
    # relative position buckets, encoder-decoder
    "t5": (lambda: T.T5ForConditionalGeneration(T.T5Config(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=256,
        decoder_start_token_id=0, pad_token_id=0)), "text"),
    # RoPE, grouped-query SDPA, RMSNorm, SwiGLU
    "llama": (_dec(T.LlamaForCausalLM, T.LlamaConfig, num_key_value_heads=2), "text"),
    # sliding-window layers, logit soft-capping
    "gemma2": (_dec(T.Gemma2ForCausalLM, T.Gemma2Config, num_key_value_heads=2, head_dim=16,
                    sliding_window=8), "text"),
    # ALiBi
    "bloom": (lambda: T.BloomForCausalLM(T.BloomConfig(hidden_size=64, n_layer=2, n_head=4,
                                                         vocab_size=256)), "text"),
    # routed experts
    "mixtral": (_dec(T.MixtralForCausalLM, T.MixtralConfig, num_key_value_heads=2,
                     num_local_experts=4, num_experts_per_tok=2), "text"),
    # multi-head latent attention (low-rank q/kv, split rope/nope heads); a dense layer, then
    # shared + routed experts chosen by a biased, grouped top-k
    "deepseek_v3": (_dec(T.DeepseekV3ForCausalLM, T.DeepseekV3Config, num_key_value_heads=4,
                         n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                         first_k_dense_replace=1, moe_intermediate_size=32, kv_lora_rank=16,
                         q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16), "text"),
    # hybrid: gated DeltaNet linear attention (the chunked PyTorch path) and gated full
    # attention layers, sparse experts with a shared expert
    "qwen3_next": (_dec(T.Qwen3NextForCausalLM, T.Qwen3NextConfig, num_key_value_heads=2, head_dim=16,
                        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=64, linear_num_key_heads=2,
                        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                        layer_types=["linear_attention", "full_attention"]), "text"),
    # selective scan (the reference PyTorch path), depthwise causal conv
    "mamba": (lambda: T.MambaForCausalLM(T.MambaConfig(hidden_size=64, num_hidden_layers=2,
                                                         vocab_size=256, state_size=8)), "text"),
    "vit": (lambda: T.ViTForImageClassification(T.ViTConfig(
        image_size=32, patch_size=8, num_labels=10, **_VIS)), "image"),
    # shifted windows (roll), patch merging
    "swin": (lambda: T.SwinForImageClassification(T.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
        num_labels=10)), "image"),
    # contrastive loss over text and image towers
    "clip": (lambda: T.CLIPModel(T.CLIPConfig(
        text_config=dict(vocab_size=256, max_position_embeddings=64, **_VIS),
        vision_config=dict(image_size=32, patch_size=8, **_VIS))), "clip"),
    # log-mel encoder, decoder with cross-attention
    "whisper": (lambda: T.WhisperForConditionalGeneration(T.WhisperConfig(
        num_mel_bins=16, max_source_positions=32, max_target_positions=64, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, **_ENC_DEC)), "audio"),
    # strided conv feature extractor, grouped positional conv, CTC loss
    "wav2vec2": (lambda: T.Wav2Vec2ForCTC(T.Wav2Vec2Config(
        vocab_size=32, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **_VIS)), "wav"),
    # diffusers: GroupNorm conv UNet with cross-attention and timestep embeddings
    "unet2d_condition": (lambda: D.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=24, norm_num_groups=8,
        attention_head_dim=8), "unet"),
    "autoencoder_kl": (lambda: D.AutoencoderKL(
        block_out_channels=(16, 32), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8,
        sample_size=16), "vae"),
    # adaptive layer norm from class labels
    "dit": (lambda: D.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, num_layers=2, sample_size=8,
        patch_size=2, num_embeds_ada_norm=10), "dit"),
    # joint text-image attention with 3-axis RoPE
    "flux": (lambda: D.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=24, pooled_projection_dim=16,
        axes_dims_rope=(4, 6, 6)), "flux"),
}


def _inputs(kind):
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    if kind == "text":
        ids = torch.randint(0, 256, (2, 24), generator=g)
        mask = torch.ones(2, 24, dtype=torch.long)
        mask[1, 18:] = 0
        return dict(input_ids=ids, attention_mask=mask, labels=ids)
    if kind == "image":
        return dict(pixel_values=r(2, 3, 32, 32), labels=torch.tensor([1, 3]))
    if kind == "clip":
        return dict(input_ids=torch.randint(0, 256, (2, 12), generator=g), pixel_values=r(2, 3, 32, 32),
                    return_loss=True)
    if kind == "audio":
        return dict(input_features=r(2, 16, 64), labels=torch.randint(0, 256, (2, 10), generator=g))
    if kind == "wav":
        return dict(input_values=r(2, 1000), labels=torch.randint(1, 32, (2, 6), generator=g))
    if kind == "unet":
        return dict(sample=r(2, 4, 16, 16), timestep=torch.tensor([3, 50]), encoder_hidden_states=r(2, 5, 24))
    if kind == "vae":
        return dict(sample=r(2, 3, 16, 16))
    if kind == "dit":
        return dict(hidden_states=r(2, 4, 8, 8), timestep=torch.tensor([3, 7]), class_labels=torch.tensor([1, 4]))
    assert kind == "flux"
    return dict(hidden_states=r(2, 16, 16), timestep=torch.tensor([0.3, 0.7]), encoder_hidden_states=r(2, 5, 24),
                pooled_projections=r(2, 16), img_ids=torch.rand(16, 3, generator=g) * 4,
                txt_ids=torch.zeros(5, 3))


def _build(name):
    """The model with every dropout probability and random training-time
    masking (SpecAugment, class-label dropout) set to 0."""
    torch.manual_seed(0)
    m = MODELS[name][0]()
    cfg = getattr(m, "config", None)
    if isinstance(cfg, T.PretrainedConfig):
        for c in [cfg] + [getattr(cfg, k) for k in ("text_config", "vision_config") if hasattr(cfg, k)]:
            for a, v in list(vars(c).items()):
                if isinstance(v, float) and ("drop" in a or (a.startswith("mask_") and a.endswith("_prob"))):
                    setattr(c, a, 0.0)
        torch.manual_seed(0)
        m = type(m)(cfg)
    for mod in m.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
        if hasattr(mod, "dropout_prob"):  # diffusers' LabelEmbedding
            mod.dropout_prob = 0.0
    return m.train()


def _step(model, kind, device, compile=False):
    m = model.to(device)
    f = torch.compile(m, backend="tpu") if compile else m
    out = f(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in _inputs(kind).items()})
    # Hugging Face models return their loss; diffusers models a sample.
    loss = out.loss if getattr(out, "loss", None) is not None else out[0].float().square().mean()
    loss.backward()
    return loss.detach().cpu(), {n: p.grad.cpu() for n, p in m.named_parameters() if p.grad is not None}


@contextlib.contextmanager
def _one_program_per_graph():
    """all_graphs_lowered, and no graph split around an op it cannot lower."""
    before = torch_pjrt.metrics()["graphs_split"]
    with all_graphs_lowered():
        yield
    assert torch_pjrt.metrics()["graphs_split"] == before, "a compiled graph was split"


def _compare(got, want):
    (lt, gt), (lc, gc) = got, want
    assert abs(lt.item() - lc.item()) <= 1e-5 * abs(lc.item()) + 1e-6, (lt.item(), lc.item())
    assert gt.keys() == gc.keys()
    # Gradients that are zero in exact arithmetic (a key projection's bias
    # under softmax) hold rounding noise on both sides: each gradient may
    # also be off by a small fraction of the model's largest one.
    scale = max(g.abs().max().item() for g in gc.values())
    for n, g in gc.items():
        err = (gt[n] - g).abs().max().item()
        assert err <= 1e-4 * g.abs().max().item() + 1e-5 * scale, f"{n}: {err} (max {g.abs().max().item()})"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_train_step_eager_and_compiled_match_cpu(name):
    kind = MODELS[name][1]
    model = _build(name)
    want = _step(copy.deepcopy(model), kind, "cpu")
    _compare(_step(copy.deepcopy(model), kind, "tpu"), want)
    torch._dynamo.reset()
    with _one_program_per_graph():
        _compare(_step(copy.deepcopy(model), kind, "tpu", compile=True), want)


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5", "mamba"])
def test_greedy_generate_matches_cpu(name):
    """Left-padded prompts; eager and, except for Mamba (whose cache is not
    a static one), a compiled forward over a static cache."""
    model = _build(name).eval()
    ids = torch.randint(3, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    want = model.generate(input_ids=ids, attention_mask=mask, **kw)
    tpu = copy.deepcopy(model).to("tpu")
    got = tpu.generate(input_ids=ids.to("tpu"), attention_mask=mask.to("tpu"), **kw)
    assert torch.equal(got.cpu(), want)
    if name == "mamba":
        return
    kw["cache_implementation"] = "static"
    want = model.generate(input_ids=ids, attention_mask=mask, **kw)
    torch._dynamo.reset()
    tpu.forward = torch.compile(tpu.forward, backend="tpu")
    with _one_program_per_graph():
        got = tpu.generate(input_ids=ids.to("tpu"), attention_mask=mask.to("tpu"), **kw)
    assert torch.equal(got.cpu(), want)
